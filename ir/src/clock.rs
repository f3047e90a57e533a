//! The calling thread's CPU time, for the single-thread kernel benchmarks: on a shared
//! machine the time a thread spends descheduled must not count against a kernel.

/// CPU seconds of the calling thread (Linux); elsewhere wall seconds since the first call.
pub fn thread_cpu_seconds() -> f64 {
    #[cfg(target_os = "linux")]
    {
        #[repr(C)]
        struct Timespec {
            sec: i64,
            nsec: i64,
        }
        extern "C" {
            fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
        }
        const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
        let mut ts = Timespec { sec: 0, nsec: 0 };
        // SAFETY: clock_gettime writes one timespec through a valid pointer.
        let rc = unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        assert_eq!(rc, 0, "clock_gettime");
        ts.sec as f64 + ts.nsec as f64 * 1e-9
    }
    #[cfg(not(target_os = "linux"))]
    {
        use std::sync::OnceLock;
        static T0: OnceLock<std::time::Instant> = OnceLock::new();
        T0.get_or_init(std::time::Instant::now).elapsed().as_secs_f64()
    }
}

#[cfg(test)]
mod tests {
    /// The clock moves forward while the thread works.
    #[test]
    fn thread_time_advances_with_work() {
        let t0 = super::thread_cpu_seconds();
        let mut x = 1u64;
        for i in 0..20_000_000u64 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(i);
        }
        std::hint::black_box(x);
        assert!(super::thread_cpu_seconds() > t0);
    }
}
