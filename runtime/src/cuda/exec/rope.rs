//! The RoPE chains as one launch each: a row's norm, RoPE and FP8 round trip
//! (`norm_rope`), the indexer query's RoPE and Hadamard transform (`rope_hadamard`), the
//! attention chunks' merge with the inverse RoPE (`merge_rope`), and the RoPE arguments they
//! share (`ds4_codegen::cuda_norm_rope`, `cuda_attention_merge`).

use super::*;

impl GpuExecutor<'_> {
    /// A RoPE op's frequencies on the device (uploaded once per table), its positions' base
    /// and multiplier for this run, and its direction.
    pub(super) fn rope_args(&self, rope: ds4_ir::NodeId, bind: Bind) -> Result<RopeArgs, ExecError> {
        let Op::Rope { inv_freq, pos, inverse, .. } = &self.graph.node(rope).op else { return Err(ExecError::Internal("not a RoPE".into())) };
        let made;
        let key = match self.plan.rope_key(rope) {
            Some(k) => k,
            None => {
                made = fusion_plan::freq_key(inv_freq);
                &made
            }
        };
        let freq = {
            let mut cache = self.freqs.lock().map_err(|_| ExecError::Internal("frequency cache poisoned".into()))?;
            match cache.get(key) {
                Some(b) => b.clone(),
                None => {
                    let host: Vec<f32> = key.iter().map(|&b| f32::from_bits(b)).collect();
                    let b = Arc::new(self.dev.upload(&host)?);
                    cache.insert(key.to_vec(), b.clone());
                    b
                }
            }
        };
        let (base, mult) = match pos {
            RopePos::Tokens => (bind.pos0, 1),
            RopePos::Compressed { ratio } => (bind.pos0 / ratio, *ratio),
        };
        Ok(RopeArgs { freq, base, mult, sign: if *inverse { -1.0 } else { 1.0 } })
    }

    /// A row's norm, RoPE and FP8 round trip as one `norm_rope` launch where the graph
    /// chains them at `norm` (`norm_rope.rs`): the values of the chain's nodes after the
    /// norm (the last one made, the others never), or None to run the ops one by one.
    /// `x`: the norm's input, `n_out` floats in rows of `n`. `DS4_NORM_ROPE=0` turns it off.
    pub(super) fn norm_rope(&self, norm: ds4_ir::NodeId, x: &DevSlice, n_out: usize, n: usize, bind: Bind) -> Result<Option<Vec<(usize, GVal)>>, ExecError> {
        if switched_off!("DS4_NORM_ROPE") || !self.kernels.by_name.contains_key(cuda_norm_rope::NAME) {
            return Ok(None);
        }
        let Some(c) = self.plan.norm_rope(norm) else { return Ok(None) };
        let rope = self.graph.node(c.rope);
        let Op::Rope { n_rot, .. } = rope.op else { return Ok(None) };
        let rope_shape = rope.ty.shape.eval(bind);
        let (heads, hd) = match rope_shape[..] {
            [_, heads, hd] => (heads, hd),
            _ => return Ok(None),
        };
        if n == 0 || n > cuda_norm_rope::MAX_N || hd != n || n_rot > n || !n_rot.is_multiple_of(2) || !n_out.is_multiple_of(n) {
            return Ok(None);
        }
        let w = match c.weight {
            Some(id) => match self.graph.weight_name(id) {
                Some(name) => Some(self.weights.vector(name)?.ptr),
                None => return Ok(None),
            },
            None => None,
        };
        let r = self.rope_args(c.rope, bind)?;
        let rows = n_out / n;
        let out = self.dev.alloc(n_out * 4)?;
        // The norm's own threads, so that its sums are the same floats.
        let norm_kernel = self.kernels.get(if w.is_some() { "rms_norm" } else { "rms_norm_plain" })?;
        let threads = self.op_threads(norm_kernel, rows, n);
        let named = [
            ("out", Arg::Ptr(out.ptr)),
            ("x", Arg::Ptr(x.ptr())),
            ("w", Arg::Ptr(w.unwrap_or(self.dummy.ptr))),
            ("n", u(n)),
            ("heads", u(heads)),
            ("n_rot", u(n_rot)),
            ("eps", Arg::F32(c.eps)),
            ("weighted", u(w.is_some() as usize)),
            ("fp8", u(c.fp8.is_some() as usize)),
            ("n_nope", u(c.fp8.unwrap_or(0))),
        ];
        let named: Vec<_> = named.into_iter().chain(r.named()).collect();
        let k = self.kernels.get(cuda_norm_rope::NAME)?;
        self.call_threads(k, cuda_norm_rope::NAME, (rows as u32, 1, 1), threads, cuda_norm_rope::shared_bytes(n), &named)?;
        Ok(Some(chain_values(&c.skipped, c.last, out, n_out)))
    }

    /// RoPE node `rope` (rows of `hd`, `heads` a token, the last `n_rot` rotated, over `x`)
    /// and the Hadamard transform after it (`norm_rope::hadamard_after`) as one
    /// `rope_hadamard_fp4` launch where it can run so (rows of the transform's 128, aligned
    /// x; `DS4_ROPE_HADAMARD=0` turns it off): the values it makes ahead of their nodes
    /// (the reshapes none, the transform's).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn rope_hadamard(&self, rope: ds4_ir::NodeId, x: &DevSlice, n_out: usize, heads: usize, hd: usize, n_rot: usize, bind: Bind) -> Result<Option<Vec<(usize, GVal)>>, ExecError> {
        let Some(c) = self.plan.rope_hadamard(rope) else { return Ok(None) };
        let fits = hd == cuda_norm_rope::HADAMARD_N && n_rot <= hd && n_rot.is_multiple_of(2) && x.ptr().is_multiple_of(16) && n_out.is_multiple_of(hd);
        if !fits || switched_off!("DS4_ROPE_HADAMARD") || !self.kernels.by_name.contains_key(cuda_norm_rope::ROPE_HADAMARD) {
            return Ok(None);
        }
        let r = self.rope_args(rope, bind)?;
        let rows = n_out / hd;
        let out = self.dev.alloc(n_out * 4)?;
        let named = [[("out", Arg::Ptr(out.ptr)), ("x", Arg::Ptr(x.ptr())), ("rows", u(rows)), ("heads", u(heads)), ("n_rot", u(n_rot)), ("fp4", u(c.fp4 as usize))].as_slice(), &r.named()].concat();
        let k = self.kernels.get(cuda_norm_rope::ROPE_HADAMARD)?;
        self.call_threads(k, cuda_norm_rope::ROPE_HADAMARD, (cuda_norm_rope::rope_hadamard_blocks(rows), 1, 1), cuda_norm_rope::ROPE_HADAMARD_THREADS, 0, &named)?;
        Ok(Some(chain_values(&c.skipped, c.hadamard, out, n_out)))
    }

    /// The attention merge and the inverse RoPE after it (node `rope`, which the plan pairs
    /// with the attention: `fusion_plan.rs`) as one `attention_merge_rope` launch over the
    /// `items` (token, head) rows of `hd` merged from `nc` chunks in `part`: the RoPE's
    /// value, or None to run them apart. `DS4_MERGE_ROPE=0` turns it off.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn merge_rope(&self, rope: ds4_ir::NodeId, part: &DevSlice, items: usize, heads: usize, hd: usize, nc: usize, bind: Bind) -> Result<Option<DeviceBuf>, ExecError> {
        if switched_off!("DS4_MERGE_ROPE") || !self.kernels.by_name.contains_key(cuda_attention_merge::ROPE_NAME) || hd > cuda_attention_merge::ROPE_MAX_HD {
            return Ok(None);
        }
        let Op::Rope { n_rot, .. } = self.graph.node(rope).op else { return Ok(None) };
        if n_rot > hd || n_rot % 2 != 0 || heads == 0 {
            return Ok(None);
        }
        let r = self.rope_args(rope, bind)?;
        let out = self.dev.alloc(items * hd * 4)?;
        let named = [[("out", Arg::Ptr(out.ptr)), ("part", Arg::Ptr(part.ptr())), ("hd", u(hd)), ("nc", u(nc)), ("heads", u(heads)), ("n_rot", u(n_rot))].as_slice(), &r.named()].concat();
        // A decode's chunk counts take the form that loads their values early (more
        // registers: a prefill's one chunk an item keeps the plain one).
        let name = self.form_or(cuda_attention_merge::EARLY_CHUNKS.contains(&nc), cuda_attention_merge::ROPE_EARLY_NAME, cuda_attention_merge::ROPE_NAME);
        let k = self.kernels.get(name)?;
        self.call_threads(k, name, (items as u32, 1, 1), cuda_attention_merge::THREADS, cuda_attention_merge::rope_shared_bytes(hd), &named)?;
        Ok(Some(out))
    }
}
