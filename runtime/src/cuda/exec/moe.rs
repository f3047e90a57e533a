//! The routed experts' node (`MoeExperts`): a prefill's expert-grouped matmuls, a decode
//! token's mat-vecs over its picked experts (in integers where they fit, `digits.rs`), the
//! SwiGLU, and the down with the picks' weights (and, folded in, the shared expert's add
//! and the expand).

use super::*;
use super::digits::DownInput;

impl GpuExecutor<'_> {
    /// A MoeExperts node: inputs x, the picks, their weights, then the gate, up and down
    /// experts; `clamp` the SwiGLU's. Values of later nodes its launches make (the add, the
    /// expand) go to `made`.
    pub(super) fn moe_experts_node(&self, nv: &NodeView, clamp: f32, made: &mut HashMap<usize, GVal>) -> Result<GVal, ExecError> {
        let (n_out, label) = (nv.n_out, nv.label);
        let (a, sel, wts) = (nv.fs(0)?.ptr(), nv.is(1)?.ptr(), nv.fs(2)?.ptr());
        let (gate, up, down) = (nv.w(3)?, nv.w(4)?, nv.w(5)?);
        let (d, k, t) = (nv.last(0), nv.last(1), nv.rows(0));
        let (ff, n_exp) = (gate.ne[1] as usize, gate.ne[2] as usize);
        // Prefill: the (token, pick) rows grouped by expert, TOKENS to a group, so that
        // each de-quantized expert weight serves its group (the tiled matmul over row
        // lists): the picks are read back (checked, as on the CPU). Decode: a mat-vec per
        // (token, pick) over the picked expert's rows, with no read (see expert_ids.rs).
        let groups = if t > 1 {
            let sel_host: Vec<i32> = nv.is(1)?.read()?;
            if let Some(bad) = sel_host.iter().find(|&&e| e < 0 || e as usize >= n_exp) {
                return Err(ExecError::Input(format!("{label}: expert id {bad} outside 0..{n_exp}")));
            }
            let (idx, gexp) = expert_groups(&sel_host, n_exp, MMA_TOKENS);
            Some((self.dev.upload(&idx)?, self.dev.upload(&gexp)?, gexp.len()))
        } else {
            None
        };
        // A decode token's integer down: its SwiGLU's digits made by the gate and up's
        // launch where it can (the rows never stored), else by `x_digits` from the rows.
        let int_down = groups.is_none() && t == 1 && self.digits_down_fits(down, d, ff, k);
        if int_down {
            if let Some(h) = self.digits_experts_swiglu(gate, up, a, sel, clamp, ff, d, k)? {
                self.digits_ahead.replace(None);
                return self.digits_down_node(nv, down, DownInput::Digits(h), sel, wts, made);
            }
        }
        let gb = self.dev.alloc(t * k * ff * 4)?;
        let ub = self.dev.alloc(t * k * ff * 4)?;
        match &groups {
            Some((idx, gexp, n_groups)) => {
                let mma = QuantKernelKind::MatMulMma;
                // Gate and up read the same x: its parts made once.
                let kernels = [self.kernels.get(&kernel_name(mma, gate.ty))?, self.kernels.get(&kernel_name(mma, up.ty))?];
                let parts = self.split_x(&kernels, a, x_parts::x_len(t * k, d, 1, k))?;
                self.matmul_launch(mma, &gb, gate, a, ff, d, t * k, 1, ff, k, Some((idx.ptr, gexp.ptr)), *n_groups, parts.as_ref())?;
                self.matmul_launch(mma, &ub, up, a, ff, d, t * k, 1, ff, k, Some((idx.ptr, gexp.ptr)), *n_groups, parts.as_ref())?;
            }
            None if t == 1 && self.digits_experts(&gb, &ub, gate, up, a, sel, ff, d, k)? => {}
            None => {
                // Row t·k + j: token t's pick j, its x row t.
                self.matvec(&gb, &MatVec { sel: Some(sel), x_div: k, ..MatVec::rows(gate, a, ff, d, t * k) })?;
                self.matvec(&ub, &MatVec { sel: Some(sel), x_div: k, ..MatVec::rows(up, a, ff, d, t * k) })?;
            }
        }
        // Digits the routing made for x and nothing took stay behind no layer.
        self.digits_ahead.replace(None);
        // A decode's integer down takes the digits of the SwiGLU, made by `x_digits` from
        // the gate and up rows: the SwiGLU is never made.
        if int_down {
            return self.digits_down_node(nv, down, DownInput::Rows { g: gb.ptr, u: ub.ptr, clamp }, sel, wts, made);
        }
        let GVal::F(h) = self.op("swiglu", t * k * ff, ff, &[("g", Arg::Ptr(gb.ptr)), ("u", Arg::Ptr(ub.ptr)), ("n", u(ff)), ("clamp", fl(clamp))])? else { unreachable!() };
        // Per token: Σ over picks of weight · down(h).
        match &groups {
            Some((idx, gexp, n_groups)) => {
                let y = self.dev.alloc(t * k * d * 4)?;
                self.matmul_launch(QuantKernelKind::MatMulMma, &y, down, h.ptr(), d, ff, t * k, 1, d, 1, Some((idx.ptr, gexp.ptr)), *n_groups, None)?;
                self.op("moe_combine", n_out, d, &[("y", Arg::Ptr(y.ptr)), ("wts", Arg::Ptr(wts)), ("k", u(k)), ("d", u(d))])
            }
            None => {
                let out = self.dev.alloc(n_out * 4)?;
                // Token t's k picks summed with their weights.
                self.matvec(&out, &MatVec { sel: Some(sel), wts: Some(wts), picks: k, ..MatVec::rows(down, h.ptr(), d, ff, t) })?;
                Ok(GVal::F(DevSlice::whole(out, n_out)))
            }
        }
    }

    /// The integer down of MoeExperts node `nv` (`digits_down`) on `h`: its value, with
    /// the graph's add of the shared expert (which this node's only reader is) and the
    /// expand of what it makes folded in where they can be (their values go to `made`).
    fn digits_down_node(&self, nv: &NodeView, down: &DeviceTensor, h: DownInput, sel: u64, wts: u64, made: &mut HashMap<usize, GVal>) -> Result<GVal, ExecError> {
        let (id, n_out) = (nv.id, nv.n_out);
        let (d, k) = (nv.last(0), nv.last(1));
        let ff = nv.w(3)?.ne[1] as usize;
        let out = self.dev.alloc(n_out * 4)?;
        // The graph's add of the shared expert, folded into the integer down
        // (`fusion_plan.rs`).
        let add = self.plan.moe_add(id).filter(|_| !switched_off!("DS4_MOE_ADD")).and_then(|(add, other)| match nv.vals.get(&other.index()) {
            Some(GVal::F(s)) if s.len == n_out => Some((add, s)),
            _ => None,
        });
        // And the expand of what it makes (the add's value, or its own), where the kernel
        // can make it.
        let expand = self.expand_to(add.map_or(id, |(add, _)| add), nv.vals, d)?.filter(|e| cuda_digits::down_expand_fits(e.nh));
        // Or the add's share of the expand left for the next `hc_pre` (`SharedLater`):
        // then the launch adds nothing and waits for no lane.
        let later = match (add, expand.as_ref()) {
            (Some((add, s)), Some(e)) => self.shared_later(add, s, e, nv.rows(0))?,
            _ => None,
        };
        let addend = add.filter(|_| later.is_none()).map(|(_, s)| s.ptr());
        made.extend(self.digits_down(&out, down, h, sel, wts, addend, expand.as_ref(), d, ff, k)?);
        let value = GVal::F(DevSlice::whole(out, n_out));
        Ok(match add {
            // The add's value is never made where its share is left for later: only the
            // expand read it.
            Some((add, _)) if later.is_some() => {
                self.shared_later.replace(later);
                fused(made, vec![(add.index(), GVal::Freed)])
            }
            Some((add, _)) => fused(made, vec![(add.index(), value)]),
            None => value,
        })
    }
}

/// Row lists for the expert-grouped matmul: the (token, pick) rows `p` of `sel` by expert,
/// in order, `tokens` to a group (-1 pads a group's tail), and each group's expert.
pub fn expert_groups(sel: &[i32], n_exp: usize, tokens: usize) -> (Vec<i32>, Vec<i32>) {
    let mut by_expert: Vec<Vec<i32>> = vec![Vec::new(); n_exp];
    for (p, &e) in sel.iter().enumerate() {
        by_expert[e as usize].push(p as i32);
    }
    let (mut idx, mut gexp) = (Vec::new(), Vec::new());
    for (e, rows) in by_expert.iter().enumerate() {
        for chunk in rows.chunks(tokens) {
            idx.extend_from_slice(chunk);
            idx.extend(std::iter::repeat_n(-1, tokens - chunk.len()));
            gexp.push(e as i32);
        }
    }
    (idx, gexp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expert_groups_list_every_row_once_by_expert() {
        let sel = [2, 0, 2, 2, 1, 2, 2, 2, 2, 2, 2, 0];
        let (idx, gexp) = expert_groups(&sel, 4, TOKENS);
        assert_eq!(gexp, vec![0, 1, 2, 2]);
        assert_eq!(idx.len(), gexp.len() * TOKENS);
        let mut seen: Vec<i32> = idx.iter().copied().filter(|&p| p >= 0).collect();
        seen.sort();
        assert_eq!(seen, (0..sel.len() as i32).collect::<Vec<_>>());
        for (g, &e) in gexp.iter().enumerate() {
            let rows = &idx[g * TOKENS..(g + 1) * TOKENS];
            assert!(rows[0] >= 0, "a group's first row is always present");
            assert!(rows.iter().filter(|&&p| p >= 0).all(|&p| sel[p as usize] == e));
        }
    }
}
