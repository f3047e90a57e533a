//! The integer (`dp4a`) paths of a decode token: x's digits, made ahead where a launch
//! before can make them (`digits_ahead`), the norm that makes them with its output, the
//! routed experts' gate, up and down, and the MoE routing in one launch (`router_select`),
//! which makes the gate and up's digits too (`ds4_codegen::cuda_digits`, `cuda_router`).

use super::*;

/// Digits of x (`x_digits`' outputs): the digit planes, the scales and the sums.
pub(super) type Digits = (DeviceBuf, DeviceBuf, DeviceBuf);

/// What the integer down reads: the digits of the experts' SwiGLU, made by the gate and
/// up's launch, or their gate rows `g` and up rows `u`, whose SwiGLU (clamp `clamp`) it
/// takes the digits of first.
pub(super) enum DownInput {
    Digits(Digits),
    Rows { g: u64, u: u64, clamp: f32 },
}

/// The dynamic shared memory a routing launch of kernel `kl` over `n` experts asks for: all
/// the kernel may have (`cuda_router::MAX_SHARED_BYTES`, 192 KiB, or what the device leaves
/// it: `Loaded::shared_room`), where it needs a few KiB, so that each of its blocks holds
/// an SM alone. The shared expert's gate and up start beside it
/// (their own lane, the same input), and where their blocks shared its SMs the routing took
/// ~7 µs where it takes ~4 alone, on the path to the routed experts. H200, synthetic q2
/// (bench/RESULTS.md, thirty-third stop): a CSA layer 131.7 -> 130.0 µs, an HCA layer
/// 106.0 -> 104.4 (traces), decode 186.7 -> 189.2 t/s (medians, two rounds). Asking for
/// 60 KB, or the kernel's preferred carveout at all shared memory with its few KiB, did not
/// do it (the first no change, the second slower). `DS4_ROUTER_ALONE=0` asks for what the
/// launch needs.
fn routing_shared_bytes(kl: &crate::cuda::compile::Loaded, n: usize) -> u32 {
    match switched_off!("DS4_ROUTER_ALONE") {
        true => cuda_router::shared_bytes(n),
        false => cuda_router::shared_bytes(n).max(kl.shared_room),
    }
}

impl GpuExecutor<'_> {
    /// Whether the integer mat-vec `name` may run (`cuda_digits.rs`) and it and `x_digits`
    /// are loaded. `DS4_DIGITS`: `0` none, `gate` only the experts' gate and up, `down`
    /// only their down (for measuring); by default all three, and the dense one for short
    /// Q8_0_R rows (`DS4_DIGITS_DENSE=0` turns that one off alone).
    pub(super) fn digits_on(&self, name: &str) -> bool {
        static ONLY: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
        let only = ONLY.get_or_init(|| std::env::var("DS4_DIGITS").ok().filter(|v| matches!(v.as_str(), "0" | "gate" | "down")));
        let allowed = match only.as_deref() {
            Some("0") => false,
            Some("gate") => name == cuda_digits::MATVEC_IQ2_XXS,
            Some("down") => name == cuda_digits::MATVEC_Q2_K,
            _ => true,
        };
        allowed && [cuda_digits::X_DIGITS, name].iter().all(|n| self.kernels.by_name.contains_key(*n))
    }

    /// Buffers for the digits of `len` values: the digit planes, the scales and the sums.
    fn alloc_digits(&self, len: usize) -> Result<Digits, ExecError> {
        Ok((self.dev.alloc(cuda_digits::digit_bytes(len))?, self.dev.alloc(len / cuda_digits::X_BLOCK * 4)?, self.dev.alloc(len / cuda_digits::SUM_SPAN * 4)?))
    }

    /// x's digits (`len` floats at `x`): the digit planes, the scales and the sums.
    /// `x`'s digits, or with `swiglu` (the up rows and the clamp) those of the clamped
    /// SwiGLU of the gate rows `x` and the up rows, which is then never made.
    pub(super) fn x_digits(&self, x: u64, len: usize, swiglu: Option<(u64, f32)>) -> Result<(DeviceBuf, DeviceBuf, DeviceBuf), ExecError> {
        let (xd, xs, xsum) = self.alloc_digits(len)?;
        let (u, clamp) = swiglu.unwrap_or((self.dummy.ptr, 0.0));
        let named = [
            ("xd", Arg::Ptr(xd.ptr)),
            ("xs", Arg::Ptr(xs.ptr)),
            ("xsum", Arg::Ptr(xsum.ptr)),
            ("x", Arg::Ptr(x)),
            ("u", Arg::Ptr(u)),
            ("k", Arg::U64(len as u64)),
            ("clamp", Arg::F32(clamp)),
            ("swiglu", Arg::U64(swiglu.is_some() as u64)),
        ];
        self.call(cuda_digits::X_DIGITS, (cuda_digits::x_digits_blocks(len) as u32, 1), &named)?;
        Ok((xd, xs, xsum))
    }

    /// Whether a token's short Q8_0_R rows may take `matvec_digits_q8_0_r` (`digits_on`;
    /// `DS4_DIGITS_DENSE=0` turns it off alone).
    pub(super) fn digits_dense_on(&self) -> bool {
        !switched_off!("DS4_DIGITS_DENSE") && self.digits_on(cuda_digits::MATVEC_Q8_0_R)
    }

    /// x's digits (`len` floats at `x`) made ahead of their use where they were
    /// (`digits_ahead`: by the routing's launch, or with x's norm), else now.
    pub(super) fn digits_of(&self, x: u64, len: usize) -> Result<(DeviceBuf, DeviceBuf, DeviceBuf), ExecError> {
        match self.digits_ahead.take().filter(|d| d.x == x && d.len == len) {
            Some(d) => Ok(d.digits),
            None => self.x_digits(x, len, None),
        }
    }

    /// Norm node `id` of a decode token's `n` values (x, weight `w`) with its output's
    /// digits, as one launch (`cuda_digits::norm_digits_source`), where a mat-vec reading
    /// it takes digits (`attn_q_a`'s norm, read by `attn_q_b`): its value, the digits left
    /// for that mat-vec (`digits_ahead`). None where it does not fit or no reader would
    /// take them (`DS4_NORM_DIGITS=0`: never).
    pub(super) fn norm_digits(&self, id: ds4_ir::NodeId, x: Arg, w: Arg, n_out: usize, n: usize, eps: f32) -> Result<Option<GVal>, ExecError> {
        let name = cuda_digits::NORM_DIGITS;
        if !cuda_digits::norm_digits_fits(n_out / n.max(1), n) || switched_off!("DS4_NORM_DIGITS") || !self.digits_dense_on() || !self.kernels.by_name.contains_key(name) {
            return Ok(None);
        }
        // A mat-vec reading the norm (`norm_matmuls`) whose weight the digits kernel takes.
        let takes_digits = |&c: &ds4_ir::NodeId| {
            let Ok(t) = weight_of(self.graph, c).and_then(|w| Ok(self.weights.tensor(&w)?)) else { return false };
            cuda_digits::dense_fits(t.ty, t.ne[1] as usize, n, 1, 1, 1, 1, false, false)
        };
        if !self.plan.norm_matmuls(id).iter().any(takes_digits) {
            return Ok(None);
        }
        let out = self.dev.alloc(n * 4)?;
        let (xd, xs, xsum) = self.alloc_digits(n)?;
        let named = [("out", Arg::Ptr(out.ptr)), ("xd", Arg::Ptr(xd.ptr)), ("xs", Arg::Ptr(xs.ptr)), ("xsum", Arg::Ptr(xsum.ptr)), ("x", x), ("w", w), ("k", Arg::U64(n as u64)), ("eps", Arg::F32(eps))];
        let k = self.kernels.get(name)?;
        self.call_threads(k, name, (1, 1, 1), n as u32, 0, &named)?;
        self.digits_ahead.replace(Some(DigitsAhead { x: out.ptr, len: n, digits: (xd, xs, xsum) }));
        Ok(Some(GVal::F(DevSlice::whole(out, n))))
    }

    /// A decode token's expert gate and up (`picks` experts of `n` rows of `k`) as one
    /// integer launch where they can run so (IQ2_XXS, whole blocks): false where not (the
    /// caller runs the float mat-vecs).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn digits_experts(&self, gb: &DeviceBuf, ub: &DeviceBuf, gate: &DeviceTensor, up: &DeviceTensor, x: u64, sel: u64, n: usize, k: usize, picks: usize) -> Result<bool, ExecError> {
        if !self.gate_up_in_digits(gate, up) {
            return Ok(false);
        }
        let (mut named, _x_digits) = self.gate_up_inputs(gate, up, x, sel, n, k, picks)?;
        named.extend([("out_g", Arg::Ptr(gb.ptr)), ("out_u", Arg::Ptr(ub.ptr))]);
        self.call(cuda_digits::MATVEC_IQ2_XXS, ((n / cuda_digits::ROWS_PER_BLOCK) as u32, 2 * picks as u32), &named)?;
        Ok(true)
    }

    /// The inputs both integer gate-and-up launches read: the weights, x's digits (made by
    /// the routing's launch where it could, `router_select`, else here), the routing and
    /// the sizes. x's digit buffers come back with the list: the caller keeps them until
    /// the launch is queued, or their memory returns to the pool under it.
    #[allow(clippy::too_many_arguments)]
    fn gate_up_inputs(&self, gate: &DeviceTensor, up: &DeviceTensor, x: u64, sel: u64, n: usize, k: usize, picks: usize) -> Result<(NamedArgs, Digits), ExecError> {
        let xd = self.digits_of(x, k)?;
        let named = vec![
            ("wg", Arg::Ptr(gate.ptr)),
            ("wu", Arg::Ptr(up.ptr)),
            ("xd", Arg::Ptr(xd.0.ptr)),
            ("xs", Arg::Ptr(xd.1.ptr)),
            ("sel", Arg::Ptr(sel)),
            ("n", u(n)),
            ("k", u(k)),
            ("row_bytes", u(row_bytes(gate.ty, k)?)),
            ("picks", u(picks)),
        ];
        Ok((named, xd))
    }

    /// A decode token's expert gate and up (`picks` experts of `n` rows of `k`) as one
    /// integer launch that makes the digits of their SwiGLU (clamp `clamp`) for the integer
    /// down instead of the rows (`cuda_digits::MATVEC_IQ2_XXS_SWIGLU`: no `x_digits` launch
    /// between them): those digits, or None where it does not run so (the rows not of
    /// whole digit blocks; `DS4_SWIGLU_DIGITS=0`: never).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn digits_experts_swiglu(&self, gate: &DeviceTensor, up: &DeviceTensor, x: u64, sel: u64, clamp: f32, n: usize, k: usize, picks: usize) -> Result<Option<Digits>, ExecError> {
        let name = cuda_digits::MATVEC_IQ2_XXS_SWIGLU;
        if switched_off!("DS4_SWIGLU_DIGITS") || !self.gate_up_in_digits(gate, up) || !cuda_digits::swiglu_fits(n) || !self.kernels.by_name.contains_key(name) {
            return Ok(None);
        }
        let (mut named, _x_digits) = self.gate_up_inputs(gate, up, x, sel, n, k, picks)?;
        let h = self.alloc_digits(picks * n)?;
        named.extend([("out_d", Arg::Ptr(h.0.ptr)), ("out_s", Arg::Ptr(h.1.ptr)), ("out_sum", Arg::Ptr(h.2.ptr)), ("clamp", Arg::F32(clamp))]);
        self.call(name, ((n / cuda_digits::X_BLOCK) as u32, picks as u32), &named)?;
        Ok(Some(h))
    }

    /// Whether a decode token's expert down (`picks` experts of `n` rows of `k`) can run
    /// as one integer launch (Q2_K, whole blocks): `digits_down`.
    pub(super) fn digits_down_fits(&self, down: &DeviceTensor, n: usize, k: usize, picks: usize) -> bool {
        cuda_digits::down_fits(down.ty, n, k, picks) && self.digits_on(cuda_digits::MATVEC_Q2_K)
    }

    /// A decode token's expert down (`picks` experts of `n` rows of `k`, x a row per pick:
    /// the SwiGLU of the gate and up rows, `h`), summed over the picks with their weights,
    /// as one integer launch (`digits_down_fits`). `addend`: n floats added to the sum, one
    /// f32 addition (the graph's `Add` of the shared expert: `fusion_plan.rs`); `expand`:
    /// the `hc_expand` of out, made too (one the kernel takes, `down_expand_fits`): its
    /// value if it was.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn digits_down(&self, out: &DeviceBuf, down: &DeviceTensor, h: DownInput, sel: u64, wts: u64, addend: Option<u64>, expand: Option<&ExpandTo>, n: usize, k: usize, picks: usize) -> Result<Option<(usize, GVal)>, ExecError> {
        let expand = self.take_expand(expand)?;
        let (xd, xs, xsum) = match h {
            DownInput::Digits(d) => d,
            DownInput::Rows { g, u, clamp } => self.x_digits(g, picks * k, Some((u, clamp)))?,
        };
        let named = [
            ("out", Arg::Ptr(out.ptr)),
            ("w", Arg::Ptr(down.ptr)),
            ("xd", Arg::Ptr(xd.ptr)),
            ("xs", Arg::Ptr(xs.ptr)),
            ("xsum", Arg::Ptr(xsum.ptr)),
            ("sel", Arg::Ptr(sel)),
            ("wts", Arg::Ptr(wts)),
            ("addend", Arg::Ptr(addend.unwrap_or(self.dummy.ptr))),
            ("n", u(n)),
            ("k", u(k)),
            ("row_bytes", u(row_bytes(down.ty, k)?)),
            ("picks", u(picks)),
            ("has_addend", u(addend.is_some() as usize)),
        ];
        let named: Vec<_> = named.into_iter().chain(self.expand_args(expand.as_ref())).collect();
        // The addend (the shared expert) may come from a side branch: it joins here.
        if addend.is_some() {
            self.join()?;
        }
        let kl = self.kernels.get(cuda_digits::MATVEC_Q2_K)?;
        self.call_threads(kl, cuda_digits::MATVEC_Q2_K, ((n / cuda_digits::DOWN_ROWS_PER_BLOCK) as u32, 1, 1), cuda_digits::down_threads(picks), 0, &named)?;
        Ok(expand.map(expand_value))
    }

    /// Whether a decode token's expert gate and up (experts of `gate.ne[1]` rows of
    /// `gate.ne[0]`) run as one integer launch (`digits_experts`): IQ2_XXS, whole blocks.
    pub(super) fn gate_up_in_digits(&self, gate: &DeviceTensor, up: &DeviceTensor) -> bool {
        gate.ty == up.ty && cuda_digits::gate_up_fits(gate.ty, gate.ne[1] as usize, gate.ne[0] as usize) && self.digits_on(cuda_digits::MATVEC_IQ2_XXS)
    }

    /// Whether routed experts node `moe`'s gate and up run in integers at a decode token
    /// (`gate_up_in_digits`) and the routing's launch can make their x's digits.
    pub(super) fn experts_take_digits(&self, moe: ds4_ir::NodeId) -> Result<bool, ExecError> {
        let name = |i: usize| self.graph.weight_name(self.graph.inputs(moe)[i]).ok_or_else(|| ExecError::Internal(format!("{}: input {i} is not a weight", self.graph.node(moe).label)));
        let (gate, up) = (self.weights.tensor(name(3)?)?, self.weights.tensor(name(4)?)?);
        Ok(self.gate_up_in_digits(gate, up) && self.kernels.by_name.contains_key(cuda_router::WITH_DIGITS))
    }

    /// The routing chain at scores node `scores` where it runs as one `router_select`
    /// launch (`tokens` tokens, `n` experts): a decode's tokens, up to
    /// `cuda_top_k::MAX_N` experts, k ≤ `cuda_router::MAX_K`, the kernel loaded with the
    /// shared memory the launch needs; `DS4_ROUTER=0`: never. `hc_pre`'s router part asks it too (`router_part`), since
    /// only that launch can add the parts it makes.
    pub(super) fn routing_launch(&self, scores: ds4_ir::NodeId, tokens: usize, n: usize) -> Option<&crate::cuda::router::RouterChain> {
        if switched_off!("DS4_ROUTER") || !(1..=cuda_router::MAX_TOKENS).contains(&tokens) {
            return None;
        }
        self.plan.router(scores).filter(|c| cuda_router::fits(n, c.k) && self.has_room(cuda_router::NAME, cuda_router::shared_bytes(n)))
    }

    /// The MoE routing that starts at scores node `scores` (`router.rs`), as one
    /// `router_select` launch where it can run so (a decode's tokens, up to
    /// `cuda_top_k::MAX_N` experts, k ≤ `cuda_router::MAX_K`; `DS4_ROUTER=0` turns it off):
    /// the values it makes ahead of their nodes (the biased scores none, the picks, the
    /// weights). `logits`: `tokens` rows of `n` (or their parts, `Logits`); `x`: the routed experts' input (the
    /// router's), whose digits the launch makes for them where they take them.
    pub(super) fn router_select(&self, scores: ds4_ir::NodeId, logits: Logits, x: Option<&DevSlice>, tokens: usize, n: usize) -> Result<Option<Vec<(usize, GVal)>>, ExecError> {
        let Some(c) = self.routing_launch(scores, tokens, n) else { return Ok(None) };
        let (sel, wts) = (self.dev.alloc(tokens * c.k * 4)?, self.dev.alloc(tokens * c.k * 4)?);
        let d = self.dummy.ptr;
        // The logits' rows, or their parts (`pnh` 0: none).
        let (rows, parts, pmix, pinv, pnh, pmw) = match logits {
            Logits::Rows(l) => (l.ptr(), d, d, d, 0, 0),
            Logits::Parts(p) => (d, p.parts.ptr, p.mix, p.inv.ptr, p.nh, p.mw),
        };
        let mut named = vec![
            ("sel", Arg::Ptr(sel.ptr)),
            ("wts", Arg::Ptr(wts.ptr)),
            ("logits", Arg::Ptr(rows)),
            ("bias", Arg::Ptr(self.weights.vector(&c.bias)?.ptr)),
            ("n", u(n)),
            ("k", u(c.k)),
            ("scale", Arg::F32(c.scale)),
            ("normalize", u(c.normalize as usize)),
            ("parts", Arg::Ptr(parts)),
            ("pmix", Arg::Ptr(pmix)),
            ("pinv", Arg::Ptr(pinv)),
            ("pnh", u(pnh)),
            ("pmw", u(pmw)),
        ];
        // With the digits of the experts' x where their gate and up will take them (a
        // decode token: `digits_experts`), in the blocks after the routing's.
        // `DS4_ROUTER_DIGITS=0` turns it off.
        let with_digits = match (c.experts, x) {
            (Some(moe), Some(_)) if tokens == 1 && !switched_off!("DS4_ROUTER_DIGITS") => self.experts_take_digits(moe)?,
            _ => false,
        };
        if let Some(x) = x.filter(|x| with_digits && x.len % cuda_digits::X_BLOCK == 0 && self.has_room(cuda_router::WITH_DIGITS, cuda_router::shared_bytes(n))) {
            let kl = self.kernels.get(cuda_router::WITH_DIGITS)?;
            let (xd, xs, xsum) = self.alloc_digits(x.len)?;
            named.extend([("xd", Arg::Ptr(xd.ptr)), ("xs", Arg::Ptr(xs.ptr)), ("xsum", Arg::Ptr(xsum.ptr)), ("x", Arg::Ptr(x.ptr())), ("xk", u(x.len)), ("tokens", u(tokens))]);
            // The routing's threads make x_digits' warps of 32 values too.
            let blocks = tokens + (x.len / cuda_digits::X_BLOCK).div_ceil(cuda_router::threads(n) as usize / 32);
            self.call_threads(kl, cuda_router::WITH_DIGITS, (blocks as u32, 1, 1), cuda_router::threads(n), routing_shared_bytes(kl, n), &named)?;
            self.digits_ahead.replace(Some(DigitsAhead { x: x.ptr(), len: x.len, digits: (xd, xs, xsum) }));
        } else {
            let kl = self.kernels.get(cuda_router::NAME)?;
            self.call_threads(kl, cuda_router::NAME, (tokens as u32, 1, 1), cuda_router::threads(n), routing_shared_bytes(kl, n), &named)?;
        }
        Ok(Some(vec![(c.biased.index(), GVal::Freed), (c.top_k.index(), GVal::I(DevSlice::whole(sel, tokens * c.k))), (c.weights.index(), GVal::F(DevSlice::whole(wts, tokens * c.k)))]))
    }
}
