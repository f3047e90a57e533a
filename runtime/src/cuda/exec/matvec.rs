//! Mat-vecs and matmuls: a decode token's mat-vec by the kernel that fits it (F16 in
//! 16-byte loads, short Q8_0_R rows in integers, every row of Q8_0_R, else the generated
//! one), the groups of mat-vecs that read the same x, and the prefill's matmuls (SIMT or
//! tensor cores, x split into bf16 parts, k split into slices); the block shapes of op
//! kernels (`ds4_codegen::quant`).

use super::*;

impl GpuExecutor<'_> {
    /// A MatMul node: a prefill's matmul, or a decode token's mat-vec together with the
    /// group's later MatMuls whose weights follow its own (one launch, each output a view
    /// of its; their values kept in `made`), and the expand of its output where it is the
    /// only one (`attn_output_b`).
    pub(super) fn matmul_node(&self, nv: &NodeView, made: &mut HashMap<usize, GVal>, skipped: &HashSet<usize>) -> Result<GVal, ExecError> {
        let (id, n_out) = (nv.id, nv.n_out);
        let (k, n, m) = (nv.last(0), nv.shape[nv.shape.len() - 1], nv.rows(0));
        let x = nv.fs(0)?.ptr();
        let w0 = nv.w(1)?;
        if m > 1 {
            let out = self.dev.alloc(n_out * 4)?;
            self.matmul(&out, w0, x, n, k, m, 1, n)?;
            return Ok(GVal::F(DevSlice::whole(out, n_out)));
        }
        let mut group = vec![(id, n)];
        let mut end = w0.ptr + w0.bytes as u64;
        while let Some((next, rows)) = self.next_in_group(id, nv.ins[0], w0, k, end, |i| nv.vals.contains_key(&i) || made.contains_key(&i) || skipped.contains(&i)) {
            group.push((next, rows));
            end = self.weights.tensor(&weight_of(nv.graph, next)?)?.ptr + (rows * w0.row_bytes(k)) as u64;
        }
        let total: usize = group.iter().map(|&(_, r)| r).sum();
        let out = std::sync::Arc::new(self.dev.alloc(total * 4)?);
        let flat = DeviceTensor { ptr: w0.ptr, ty: w0.ty, ne: vec![k as u64, total as u64], bytes: total * w0.row_bytes(k) };
        let expand = if group.len() == 1 { self.expand_to(id, nv.vals, n)? } else { None };
        made.extend(self.matvec_expand(&out, &MatVec::rows(&flat, x, total, k, 1), expand.as_ref())?);
        let mut off = n;
        for &(other, rows) in &group[1..] {
            made.insert(other.index(), GVal::F(DevSlice { buf: out.clone(), off, len: rows }));
            off += rows;
        }
        Ok(GVal::F(DevSlice { buf: out, off: 0, len: n }))
    }

    /// A GroupedMatMul node (`attn_output_a`): `groups` row groups, each reading its own
    /// part of x.
    pub(super) fn grouped_matmul_node(&self, nv: &NodeView, groups: usize) -> Result<GVal, ExecError> {
        let (kg, n, m) = (nv.last(0) / groups, nv.shape[nv.shape.len() - 1], nv.rows(0));
        let out = self.dev.alloc(nv.n_out * 4)?;
        let x = nv.fs(0)?.ptr();
        if m > 1 {
            self.matmul(&out, nv.w(1)?, x, n, kg, m, groups, n / groups)?;
        } else {
            self.matvec(&out, &MatVec { groups, ng: n / groups, ..MatVec::rows(nv.w(1)?, x, n, kg, m) })?;
        }
        Ok(GVal::F(DevSlice::whole(out, nv.n_out)))
    }

    /// The next mat-vec of a decode group (`matvec_groups.rs`): a MatMul node not yet run
    /// (`done` false) that reads the same x node, whose weight (of `first`'s type, rows of
    /// `k`) starts at `end`; its node and row count.
    /// `DS4_MATVEC_GROUPS=0` turns the groups off.
    pub(super) fn next_in_group(&self, from: ds4_ir::NodeId, x: ds4_ir::NodeId, first: &DeviceTensor, k: usize, end: u64, done: impl Fn(usize) -> bool) -> Option<(ds4_ir::NodeId, usize)> {
        if switched_off!("DS4_MATVEC_GROUPS") {
            return None;
        }
        self.graph.consumers(x).into_iter().find_map(|c| {
            // Not across the lanes of a graph's side branch: the other lane would read the
            // output unordered (`fusion_plan.rs`).
            if !matches!(self.graph.node(c).op, Op::MatMul) || done(c.index()) || self.graph.inputs(c)[0] != x || self.lane_of(c) != self.lane_of(from) {
                return None;
            }
            let t = self.weights.tensor(&weight_of(self.graph, c).ok()?).ok()?;
            (t.ptr == end && t.ty == first.ty && t.ne[0] == k as u64).then(|| (c, t.ne[1] as usize))
        })
    }

    /// Threads per block of an op kernel over `items` items of `work` parallel iterations
    /// (the kernel's own for a CUDA-text kernel with a fixed layout, and always with
    /// `DS4_OP_THREADS=full`):
    /// - many items (a prefill): about four iterations a thread, at least a warp, at most
    ///   the kernel's own. A block of 512 threads for a RoPE or norm of 512 values left
    ///   most of its threads idle through the item's barriers and dependent steps; smaller
    ///   blocks put more items on an SM at once.
    /// - fewer items than SMs, each in one block (a decode step; the GPU is mostly idle):
    ///   a thread per iteration, up to the most the kernel allows (a norm over 16384
    ///   values in one block: 1024 threads), and one warp for small work (the
    ///   hyper-connection mix's 24 values: its barriers then hold one warp, not 16).
    pub(super) fn op_threads(&self, k: &Loaded, items: usize, work: usize) -> u32 {
        static FULL: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        if !k.any_block || *FULL.get_or_init(|| std::env::var("DS4_OP_THREADS").as_deref() == Ok("full")) {
            return k.threads;
        }
        // Whole warps giving each thread `per_thread` of the item's iterations.
        let for_work = |per_thread: usize| (work.div_ceil(per_thread).div_ceil(32) * 32).max(32) as u32;
        if items >= 4 * self.dev.sms {
            for_work(4).min(k.threads)
        } else if items < self.dev.sms && !k.splits_items {
            for_work(1).min(k.max_threads)
        } else {
            k.threads
        }
    }

    /// Blocks per item: one, but where a launch has fewer items than the GPU has SMs
    /// (a decode step) and the kernel allows it, enough to give the SMs two blocks
    /// each, and each thread at least `per_thread` of the item's `work` iterations.
    pub(super) fn item_splits(&self, k: &Loaded, items: usize, work: usize, per_thread: usize) -> usize {
        if !k.splits_items || items >= self.dev.sms {
            return 1;
        }
        let by_work = work.div_ceil(per_thread * k.threads as usize);
        by_work.min((2 * self.dev.sms).div_ceil(items)).max(1)
    }

    /// `out[t·n + r] = Σ picks …` (see `ds4_codegen::quant`): the mat-vec `mv`.
    pub(super) fn matvec(&self, out: &DeviceBuf, mv: &MatVec) -> Result<(), ExecError> {
        self.matvec_expand(out, mv, None).map(|_| ())
    }

    /// [`GpuExecutor::matvec`], and `expand`, the `hc_expand` of out, made by the same
    /// launch where its kernel can (the dense one): its value if it was.
    pub(super) fn matvec_expand(&self, out: &DeviceBuf, mv: &MatVec, expand: Option<&ExpandTo>) -> Result<Option<(usize, GVal)>, ExecError> {
        let &MatVec { w, x, sel, wts, n, k, m, picks, x_div, groups, ng } = mv;
        // A token's F16 rows in 16-byte loads (cuda_f16_vec.rs).
        if w.ty == ds4_ir::GgmlType::F16 && picks == 1 && wts.is_none() && cuda_f16_vec::fits(n, k, ng, m, sel.is_some()) && (w.ptr | x) % 16 == 0 && !switched_off!("DS4_F16_VEC") && self.kernels.by_name.contains_key(cuda_f16_vec::NAME) {
            let named = [("out", Arg::Ptr(out.ptr)), ("w", Arg::Ptr(w.ptr)), ("x", Arg::Ptr(x)), ("n", u(n)), ("k", u(k)), ("ng", u(ng))];
            self.call(cuda_f16_vec::NAME, (cuda_f16_vec::blocks(n), 1), &named)?;
            return Ok(None);
        }
        // A token's short Q8_0_R rows (`attn_q_b`) in dp4a against x's digits
        // (cuda_digits.rs; `DS4_DIGITS_DENSE=0` turns it off).
        if expand.is_none() && cuda_digits::dense_fits(w.ty, n, k, m, groups, picks, x_div, sel.is_some(), wts.is_some()) && w.ptr.is_multiple_of(4) && self.digits_dense_on() {
            // Made with x's norm where they could be (`norm_digits`), else here.
            let (xd, xs, _xsum) = self.digits_of(x, k)?;
            let named = [("out", Arg::Ptr(out.ptr)), ("w", Arg::Ptr(w.ptr)), ("xd", Arg::Ptr(xd.ptr)), ("xs", Arg::Ptr(xs.ptr)), ("n", u(n)), ("k", u(k)), ("row_bytes", u(w.row_bytes(k)))];
            self.call(cuda_digits::MATVEC_Q8_0_R, ((n / cuda_digits::ROWS_PER_BLOCK) as u32, 1), &named)?;
            return Ok(None);
        }
        // Every row of Q8_0_R for each token, in its own kernel (quant/cuda_matvec_dense.rs;
        // short rows sixteen a block, `DS4_DENSE_SHORT=0` four).
        let form = cuda_matvec_dense::form(k, !switched_off!("DS4_DENSE_SHORT"));
        if cuda_matvec_dense::fits(form, w.ty, n, k, m, groups, ng, picks, x_div, sel.is_some(), wts.is_some()) && (w.ptr | w.row_bytes(k) as u64 | x).is_multiple_of(16) && !switched_off!("DS4_MATVEC_DENSE") && self.kernels.by_name.contains_key(form.name) {
            let expand = self.take_expand(expand.filter(|e| cuda_matvec_dense::expand_fits(form, groups, e.nh)))?;
            let mut named = vec![("out", Arg::Ptr(out.ptr)), ("w", Arg::Ptr(w.ptr)), ("x", Arg::Ptr(x)), ("n", u(n)), ("k", u(k)), ("row_bytes", u(w.row_bytes(k))), ("groups", u(groups)), ("ng", u(ng))];
            named.extend(self.expand_args(expand.as_ref()));
            let (ride, comb) = self.ride_args(m)?;
            named.extend(ride);
            self.call(form.name, cuda_matvec_dense::grid(form, n, m, comb), &named)?;
            return Ok(expand.map(expand_value));
        }
        let row_blocks = matvec_row_blocks(w.ty, n, m, groups, ng, self.dev.sms);
        let named = [
            ("out", Arg::Ptr(out.ptr)),
            ("w", Arg::Ptr(w.ptr)),
            ("x", Arg::Ptr(x)),
            ("sel", Arg::Ptr(sel.unwrap_or(self.dummy.ptr))),
            ("wts", Arg::Ptr(wts.unwrap_or(self.dummy.ptr))),
            ("n", u(n)),
            ("k", u(k)),
            ("row_bytes", u(w.row_bytes(k))),
            ("picks", u(picks)),
            ("x_div", u(x_div)),
            ("groups", u(groups)),
            ("ng", u(ng)),
            ("has_sel", u(sel.is_some() as usize)),
            ("has_wts", u(wts.is_some() as usize)),
            ("row_blocks", u(row_blocks)),
        ];
        self.call(&kernel_name(QuantKernelKind::MatVec, w.ty), (row_blocks as u32, m as u32), &named)?;
        Ok(None)
    }

    /// `out[t·n + r] = W[r] · x[(t·groups + r / ng)·k ..]` for m > 1 tokens: on tensor
    /// cores where a tile of rows stays inside one row group, else the SIMT kernel.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn matmul(&self, out: &DeviceBuf, w: &DeviceTensor, x: u64, n: usize, k: usize, m: usize, groups: usize, ng: usize) -> Result<(), ExecError> {
        if groups == 1 || ng.is_multiple_of(MMA_ROWS) {
            self.matmul_launch(QuantKernelKind::MatMulMma, out, w, x, n, k, m, groups, ng, 1, None, m.div_ceil(MMA_TOKENS), None)
        } else {
            self.matmul_launch(QuantKernelKind::MatMul, out, w, x, n, k, m, groups, ng, 1, None, m.div_ceil(TOKENS), None)
        }
    }

    /// x's bf16 parts (`x_parts.rs`), split here from the `len` floats at `x`, when one of
    /// `kernels` reads them; None otherwise.
    pub(super) fn split_x(&self, kernels: &[&Loaded], x: u64, len: usize) -> Result<Option<XParts>, ExecError> {
        if !kernels.iter().any(|k| k.reads_x_parts) {
            return Ok(None);
        }
        let p = XParts::alloc(self.dev, len)?;
        let (grid, named) = p.split_args(x);
        self.call_loaded(self.kernels.get(x_parts::SPLIT_KERNEL)?, x_parts::SPLIT_KERNEL, grid, 0, &named)?;
        Ok(Some(p))
    }

    /// A matmul kernel (`kind`); `listed`: (row lists, experts) of `blocks_y` expert groups;
    /// `parts`: x's bf16 parts when the caller made them already (the experts' gate and up
    /// share x), else made here where the kernel reads them.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn matmul_launch(&self, kind: QuantKernelKind, out: &DeviceBuf, w: &DeviceTensor, x: u64, n: usize, k: usize, m: usize, groups: usize, ng: usize, x_div: usize, listed: Option<(u64, u64)>, blocks_y: usize, parts: Option<&XParts>) -> Result<(), ExecError> {
        let (idx, gexp) = listed.unwrap_or((self.dummy.ptr, self.dummy.ptr));
        let blocks_x = if kind == QuantKernelKind::MatMulMma { n.div_ceil(MMA_ROWS) } else { n };
        // Few tiles over long rows (the hyper-connection projections: one 64-row tile):
        // a split over k into slices of their own output copies, added after.
        let (k_slice, slices) = match (kind, listed) {
            (QuantKernelKind::MatMulMma, None) => mma_k_slices(blocks_x * blocks_y, k, k_unit_of(w.ty)?, self.dev.sms),
            _ => (k, 1),
        };
        let scratch = if slices > 1 { Some(self.dev.alloc(slices * m * n * 4)?) } else { None };
        let name = kernel_name(kind, w.ty);
        let kl = self.kernels.get(&name)?;
        let own = match parts {
            None => self.split_x(&[kl], x, x_parts::x_len(m, k, groups, x_div))?,
            Some(_) => None,
        };
        let [xp, xs16, xp_stride] = x_parts::mma_args(parts.or(own.as_ref()).filter(|_| kl.reads_x_parts), self.dummy.ptr);
        let named = [
            ("out", Arg::Ptr(scratch.as_ref().map_or(out.ptr, |s| s.ptr))),
            ("w", Arg::Ptr(w.ptr)),
            ("x", Arg::Ptr(x)),
            ("idx", Arg::Ptr(idx)),
            ("gexp", Arg::Ptr(gexp)),
            ("n", u(n)),
            ("k", u(k)),
            ("row_bytes", u(w.row_bytes(k))),
            ("m", u(m)),
            ("groups", u(groups)),
            ("ng", u(ng)),
            ("x_div", u(x_div)),
            ("has_idx", u(listed.is_some() as usize)),
            ("k_slice", u(k_slice)),
            ("out_slice", u(m * n)),
            xp,
            xs16,
            xp_stride,
        ];
        self.call_loaded(kl, &name, (blocks_x as u32, blocks_y as u32, slices as u32), kl.dyn_shared, &named)?;
        if let Some(s) = scratch {
            // The slices added in order (deterministic): out = s0 + s1, then out += s_z.
            let slice = |z: usize| s.ptr + (z * m * n * 4) as u64;
            for z in 1..slices {
                let a = if z == 1 { slice(0) } else { out.ptr };
                self.items_into("add", out.ptr, m, n, (n, 4), &[("a", Arg::Ptr(a)), ("b", Arg::Ptr(slice(z))), ("n", u(n))])?;
            }
        }
        Ok(())
    }
}
