//! The attention's nodes: the compressor's pooled rows (`CompressPool`, from the device
//! logs of `slot_ops`) and the attention over window and compressed or selected rows,
//! split into chunks and merged (with the inverse RoPE where the plan pairs them).

use super::*;

/// Blocks per SM an attention launch aims for.
const ATTENTION_BLOCKS_PER_SM: usize = 4;

/// The most chunks an attention item's rows are split into.
const ATTENTION_MAX_CHUNKS: usize = 32;

/// Chunks an attention launch splits each item's rows into: enough for
/// [`ATTENTION_BLOCKS_PER_SM`] blocks an SM (`blocks`: the launch's blocks at one chunk),
/// at most [`ATTENTION_MAX_CHUNKS`], but no more than one per `min_rows` of the `seen`
/// rows a token may see (window and compressed or selected rows). A decode token of an
/// HCA layer at ctx 2048 sees 144 rows: 32 chunks gave each block a part of one
/// `attention_tiled` tile (16 rows) and the merge 32 partial rows a head to fold, where 9
/// chunks cost the attention no more and the merge less. H200, synthetic q2, decode
/// steady t/s, two rounds (`DS4_ATT_CHUNK_ROWS`, 0 for no floor): none 149.37 / 151.38,
/// 16 rows 152.18 / 151.98, 32 150.55 / 149.19, 64 145.36 / 145.60; ctx 8192 150.79 →
/// 151.47 (16).
fn attention_chunks(blocks: usize, sms: usize, seen: usize, min_rows: usize) -> usize {
    let by_sms = (ATTENTION_BLOCKS_PER_SM * sms / blocks.max(1)).clamp(1, ATTENTION_MAX_CHUNKS);
    if min_rows == 0 {
        by_sms
    } else {
        by_sms.min(seen.div_ceil(min_rows).max(1))
    }
}

/// Rows an attention chunk takes at least: one `attention_tiled` tile.
/// `DS4_ATT_CHUNK_ROWS` overrides it (0: no floor; for measuring).
fn attention_chunk_rows() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| std::env::var("DS4_ATT_CHUNK_ROWS").ok().and_then(|v| v.parse().ok()).unwrap_or(cuda_attention::TILE_ROWS))
}

impl GpuExecutor<'_> {
    /// A CompressPool node: the new compressed rows' slots gathered from the logs (kv,
    /// then gate + ape), then pooled.
    pub(super) fn compress_pool_node(&self, nv: &NodeView, state: &mut SessionState<DeviceLog>, slot: ds4_ir::Slot, ratio: usize, overlap: bool, wd: usize) -> Result<GVal, ExecError> {
        let logs = slot_ops::compress_log(state, slot, ratio, overlap, nv.last(0), nv.fs(0)?, nv.fs(1)?, nv.shape[0], nv.bind, nv.label)?;
        let slots = slot_ops::pool_slots(ratio, overlap);
        let per_row = slots * wd;
        let named = [
            ("kv", Arg::Ptr(logs.kv.ptr())),
            ("gate", Arg::Ptr(logs.gate.ptr())),
            ("ape", nv.vecf(2)?),
            ("n_rows", u(logs.n_rows)),
            ("first_row", u(logs.first_row)),
            ("first", u(logs.first)),
            ("ratio", u(ratio)),
            ("slots", u(slots)),
            ("w", u(wd)),
        ];
        let GVal::F(gathered) = self.op("compress_gather", 2 * logs.n_rows * per_row, per_row, &named)? else { unreachable!() };
        let (kv, gate) = (gathered.ptr(), gathered.ptr() + (logs.n_rows * per_row * 4) as u64);
        self.op("compress_pool", nv.n_out, wd, &[("kv", Arg::Ptr(kv)), ("gate", Arg::Ptr(gate)), ("slots", u(slots)), ("w", u(wd))])
    }

    /// An Attention node: inputs q, the window's rows, the sinks, then the compressed rows
    /// and the selection where `comp` has them. The inverse RoPE the merge makes goes to
    /// `made`.
    pub(super) fn attention_node(&self, nv: &NodeView, window: usize, ratio: usize, comp: &CompMode, made: &mut HashMap<usize, GVal>) -> Result<GVal, ExecError> {
        let (id, n_out, bind) = (nv.id, nv.n_out, nv.bind);
        let comp = if self.plan.all_rows().every_row(id, bind) { &CompMode::Causal } else { comp };
        let (heads, hd) = (nv.shape[1], nv.shape[2]);
        let n_win = nv.in_shape(1)[0];
        let win_pos0 = bind.pos0 - bind.window_prior(window);
        let dummy = Arg::Ptr(self.dummy.ptr);
        let (comp_rows, n_comp) = if *comp != CompMode::None { (nv.f(3)?, nv.in_shape(3)[0]) } else { (dummy, 0) };
        let (sel, k_sel) = if *comp == CompMode::Selected { (nv.iv(4)?, nv.last(4)) } else { (dummy, 0) };
        let mode = match comp {
            CompMode::None => ds4_ir::kernels::attention::COMP_NONE,
            CompMode::Causal => ds4_ir::kernels::attention::COMP_CAUSAL,
            CompMode::Selected => ds4_ir::kernels::attention::COMP_SELECTED,
        };
        let scale = 1.0 / (hd as f32).sqrt();
        let named = [
            ("q", nv.f(0)?),
            ("win", nv.f(1)?),
            ("comp", comp_rows),
            ("sel", sel),
            ("sinks", nv.vecf(2)?),
            ("heads", u(heads)),
            ("hd", u(hd)),
            ("pos0", u(bind.pos0)),
            ("win_pos0", u(win_pos0)),
            ("n_win", u(n_win)),
            ("window", u(window)),
            ("n_comp", u(n_comp)),
            ("comp_mode", u(mode)),
            ("ratio", u(ratio)),
            ("k_sel", u(k_sel)),
            ("scale", fl(scale)),
        ];
        // Each item's rows in `nc` chunks, then the merge: few blocks (decode) get more
        // chunks, so that the launch has ~4 blocks per SM, but no chunk fewer rows than a
        // tile (`attention_chunks`). attention_tiled serves 16 heads of a token per block,
        // holding their Q and O in registers; heads wider than MAX_HD take the generated
        // attention_partial (a block per head).
        let (items, tokens) = (n_out / hd, nv.shape[0]);
        let tiled = hd <= cuda_attention::MAX_HD && self.kernels.by_name.contains_key(cuda_attention::NAME);
        let blocks = if tiled { cuda_attention::blocks(tokens, heads, 1) } else { items };
        let seen = n_win + if *comp == CompMode::Selected { k_sel } else { n_comp };
        let nc = attention_chunks(blocks, self.dev.sms, seen, attention_chunk_rows());
        let mut pnamed: Vec<(&str, Arg)> = named.to_vec();
        pnamed.push(("nc", u(nc)));
        let part = if tiled {
            let part = self.dev.alloc(items * nc * (hd + 2) * 4)?;
            pnamed.push(("out", Arg::Ptr(part.ptr)));
            // At most one block an SM (a decode): the form with registers for one block.
            let grid = cuda_attention::blocks(tokens, heads, nc);
            let name = self.form_or(cuda_attention::one_a_sm(grid, self.dev.sms), cuda_attention::ONE_NAME, cuda_attention::NAME);
            self.call(name, (grid as u32, 1), &pnamed)?;
            DevSlice::whole(part, items * nc * (hd + 2))
        } else {
            let GVal::F(part) = self.op("attention_partial", items * nc * (hd + 2), hd + 2, &pnamed)? else { unreachable!() };
            part
        };
        // A warp takes the chunks' maxima and sums where they fit one
        // (cuda_attention_merge.rs: the same contract and floats). `DS4_MERGE_WARP=0`
        // turns it off (for measuring).
        let warp = !switched_off!("DS4_MERGE_WARP") && cuda_attention_merge::fits(nc) && self.kernels.by_name.contains_key(cuda_attention_merge::NAME);
        // With the inverse RoPE after it where the plan pairs them.
        let with_rope = match self.plan.attention_rope(id).filter(|_| warp) {
            Some(rope) => self.merge_rope(rope, &part, items, heads, hd, nc, bind)?.map(|out| (rope, out)),
            None => None,
        };
        match with_rope {
            Some((rope, out)) => Ok(fused(made, vec![(rope.index(), GVal::F(DevSlice::whole(out, n_out)))])),
            None => self.op(if warp { cuda_attention_merge::NAME } else { "attention_merge" }, n_out, hd, &[("part", Arg::Ptr(part.ptr())), ("hd", u(hd)), ("nc", u(nc))]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A decode token's chunks: 132 SMs and 4 blocks (64 heads in groups of 16) ask for
    /// 132, capped at 32; the rows seen cap them at one a tile; a prefill's many blocks
    /// take one.
    #[test]
    fn attention_chunks_follow_the_sms_and_the_rows_seen() {
        assert_eq!(attention_chunks(4, 132, 640, 16), 32, "a CSA layer: 512 picks and the window");
        assert_eq!(attention_chunks(4, 132, 144, 16), 9, "an HCA layer at ctx 2048");
        assert_eq!(attention_chunks(4, 132, 144, 0), 32, "no floor");
        assert_eq!(attention_chunks(4, 132, 3, 16), 1);
        assert_eq!(attention_chunks(4, 132, 0, 16), 1);
        assert_eq!(attention_chunks(8192, 132, 144, 16), 1, "a prefill");
    }
}
