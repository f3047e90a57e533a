//! The lightning indexer's nodes: its scores of every compressed row (`IndexerScores`) and
//! the top-k selections (`TopK`, the indexer's and the router's), by the kernel that fits
//! the row length.

use super::*;

impl GpuExecutor<'_> {
    /// An IndexerScores node: inputs the queries [T, heads, dk], their weights, the rows.
    pub(super) fn indexer_scores_node(&self, nv: &NodeView, ratio: usize) -> Result<GVal, ExecError> {
        let (n_out, bind) = (nv.n_out, nv.bind);
        let (qs, n_rows) = (nv.in_shape(0), nv.shape[1]);
        let (tokens, heads, dk) = (qs[0], qs[1], qs[2]);
        let (q, rows) = (nv.fs(0)?.ptr(), nv.fs(2)?.ptr());
        let common = [("n_rows", u(n_rows)), ("heads", u(heads)), ("dk", u(dk)), ("pos0", u(bind.pos0)), ("ratio", u(ratio))];
        // A decode token's scores in one launch (cuda_indexer_scores.rs: the CPU's
        // floats); `DS4_INDEXER_VEC=0` turns it off.
        if cuda_indexer_scores::fits(tokens, heads, dk, n_rows) && self.has_room(cuda_indexer_scores::NAME, cuda_indexer_scores::shared_bytes(heads, dk)) && (q | rows) % 16 == 0 && !switched_off!("DS4_INDEXER_VEC") {
            let out = self.dev.alloc(n_out * 4)?;
            let tile = cuda_indexer_scores::tile_rows(n_rows, self.dev.sms);
            let named = [&[("out", Arg::Ptr(out.ptr)), ("q", Arg::Ptr(q)), ("w", nv.f(1)?), ("rows", Arg::Ptr(rows)), ("tile_rows", u(tile))][..], &common].concat();
            let k = self.kernels.get(cuda_indexer_scores::NAME)?;
            self.call_threads(k, cuda_indexer_scores::NAME, (cuda_indexer_scores::blocks(n_rows, tile, self.dev.sms), tokens as u32, 1), cuda_indexer_scores::threads(heads), cuda_indexer_scores::shared_bytes(heads, dk), &named)?;
            return Ok(GVal::F(DevSlice::whole(out, n_out)));
        }
        // Two steps (see `indexer_head_dots`). Step 1 is every (token, head) query against
        // every row: one tensor-core matmul with the rows as an F32 "weight" (rows a query
        // may not see are computed and then masked by step 2).
        let dots = self.dev.alloc(n_out * heads * 4)?;
        let rows = DeviceTensor { ptr: rows, ty: ds4_ir::GgmlType::F32, ne: vec![dk as u64, n_rows as u64], bytes: n_rows * dk * 4 };
        let m = tokens * heads;
        self.matmul_launch(QuantKernelKind::MatMulMma, &dots, &rows, q, n_rows, dk, m, 1, n_rows, 1, None, m.div_ceil(MMA_TOKENS), None)?;
        self.op("indexer_combine", n_out, n_rows, &[&[("dots", Arg::Ptr(dots.ptr)), ("w", nv.f(1)?)][..], &common].concat())
    }

    /// A TopK node: each row's `k` best scores' places (i32).
    pub(super) fn top_k_node(&self, nv: &NodeView, k: usize) -> Result<GVal, ExecError> {
        let (n, n_out) = (nv.last(0), nv.n_out);
        let named = [("scores", nv.f(0)?), ("n", u(n)), ("k", u(k))];
        // Long rows (the indexer's at long contexts): a radix selection, then a sort of the
        // k picks (cuda_top_k_radix.rs; `DS4_TOP_K_RADIX=0` turns it off); shorter ones: a
        // block sorts each row in shared memory (cuda_top_k.rs). Both: a block a row.
        // An attention's selection read by it alone: the radix selection's picks in row
        // order, unsorted (`FusionPlan::rows_top_k`; `DS4_TOP_K_ROWS=0` sorts).
        let rows = self.plan.rows_top_k(nv.id) && cuda_top_k_radix::fits(k) && !switched_off!("DS4_TOP_K_ROWS") && self.kernels.by_name.contains_key(cuda_top_k_radix::ROWS_NAME);
        // The sort holds the row's keys in shared memory: where the device has the room.
        let sorts = cuda_top_k::fits(n) && self.has_room(cuda_top_k::NAME, cuda_top_k::shared_bytes(n));
        let radix = (n > cuda_top_k_radix::FROM_N || !sorts) && cuda_top_k_radix::fits(k) && !switched_off!("DS4_TOP_K_RADIX");
        let block = if rows {
            (cuda_top_k_radix::ROWS_NAME, cuda_top_k_radix::THREADS, 0)
        } else if radix {
            (cuda_top_k_radix::NAME, cuda_top_k_radix::THREADS, cuda_top_k_radix::shared_bytes(n, k))
        } else {
            (cuda_top_k::NAME, cuda_top_k::threads(n), cuda_top_k::shared_bytes(n))
        };
        match self.kernels.by_name.get(block.0).filter(|_| (rows || radix || sorts) && n_out > 0) {
            Some(kl) => {
                let out = self.dev.alloc(n_out * 4)?;
                let mut all = vec![("out", Arg::Ptr(out.ptr))];
                all.extend_from_slice(&named);
                self.call_threads(kl, block.0, ((n_out / k) as u32, 1, 1), block.1, block.2, &all)?;
                Ok(GVal::I(DevSlice::whole(out, n_out)))
            }
            // Otherwise by rank, a candidate's rank a scan of up to n scores, one candidate
            // per thread, an item over as many blocks as that takes.
            None => {
                let GVal::F(s) = self.op_over("top_k", n_out, k, (n.max(1), 1), &named)? else { unreachable!() };
                Ok(GVal::I(s))
            }
        }
    }
}
