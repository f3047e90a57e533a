//! The hyper-connections' launches: `hc_pre` (the sublayer's mix, collapse and norm in one
//! grid), where its Sinkhorn goes (`CombHome`: a launch at the shared expert's lane head, or
//! a spare block of the next dense mat-vec), and the expand that the launch making its y
//! makes too (`ExpandTo`; `ds4_codegen::cuda_hc_pre`, `cuda_hc_expand`).

use super::*;

impl<'a> GpuExecutor<'a> {
    /// The hyper-connection pre chain that starts at norm node `norm` (`hc_pre.rs`), as
    /// one `hc_pre` launch where it can run so (a decode's few tokens, an F16 projection,
    /// a mix that fits a warp; `DS4_HC_PRE=0` turns it off): the values it makes ahead
    /// of their nodes (the projection's none, the mix, the collapse, the collapse's
    /// weighted norm where that is its only reader). `x`: the norm's
    /// input, `tokens` rows of `n` floats (the streams).
    pub(super) fn hc_pre(&self, norm: ds4_ir::NodeId, x: &DevSlice, tokens: usize, n: usize, eps: f32) -> Result<Option<Vec<(usize, GVal)>>, ExecError> {
        let chain = self.plan.hc_pre(norm);
        // The shared expert's share an FFN's expand left for this launch (`SharedLater`).
        let later = self.shared_later.borrow_mut().take_if(|l| chain.is_some_and(|c| c.streams.index() == l.streams));
        let taken = self.chain_takes(chain, tokens, n)?.filter(|_| x.ptr().is_multiple_of(16));
        let Some((c, w)) = taken else {
            return match later {
                Some(_) => Err(ExecError::Internal(format!("{}: the shared expert's share was left for an hc_pre launch that does not run", self.graph.node(norm).label))),
                None => Ok(None),
            };
        };
        let (mw, d) = (ds4_ir::kernels::hc::mix_width(c.nh), n / c.nh);
        let (mix, proj) = (self.dev.alloc(tokens * mw * 4)?, self.dev.alloc(tokens * mw * 4)?);
        // The router's mat-vec as parts in blocks of their own (`router_part`).
        let router = self.router_part(c, tokens, d, mix.ptr)?;
        // The Sinkhorn out of this launch (`CombHome`): the FFN's at the head of the
        // shared expert's lane where the collapse's norm feeds it and the router's
        // mat-vec is a launch of its own, the others' riding the next dense mat-vec (with
        // the router in this launch, the FFN's rides the shared expert's gate and up:
        // the lane's head launch then held its gate and up back until they met the routed
        // experts' gate and up, which start earlier). `DS4_COMB_BESIDE=0` keeps them all
        // in this launch, `DS4_COMB_RIDE=0` rides none.
        let home = match c.feeds_shared_expert && branch_on(Branch::SharedExpert) && router.is_none() {
            true => Some(CombHome::SharedExpert),
            false => (!switched_off!("DS4_COMB_RIDE")).then_some(CombHome::Ride),
        };
        let home = home.filter(|_| !switched_off!("DS4_COMB_BESIDE") && self.kernels.by_name.contains_key(cuda_hc_pre::HC_COMB));
        // The collapse's norm too, where its weight is a vector of d floats.
        let norm = match &c.norm {
            Some((id, w, eps)) => Some((*id, self.weights.vector(w)?.ptr, *eps, self.dev.alloc(tokens * d * 4)?)),
            None => None,
        };
        // The collapse, except where the launch norms it from registers and so never
        // writes it (`cuda_hc_pre::held`).
        let y = match norm.is_some() && cuda_hc_pre::held(c.nh, d) {
            true => None,
            false => Some(self.dev.alloc(tokens * d * 4)?),
        };
        let r_rows = router.as_ref().map_or(0, |r| r.1);
        // The streams made whole, where a share is added.
        let whole = later.as_ref().map(|_| self.dev.alloc(tokens * n * 4)).transpose()?;
        let named = [
            ("rw", Arg::Ptr(router.as_ref().map_or(self.dummy.ptr, |r| r.0))),
            ("rparts", Arg::Ptr(router.as_ref().map_or(self.dummy.ptr, |r| r.2.parts.ptr))),
            ("ainv", Arg::Ptr(router.as_ref().map_or(self.dummy.ptr, |r| r.2.inv.ptr))),
            ("r_rows", u(r_rows)),
            ("mix", Arg::Ptr(mix.ptr)),
            ("y", Arg::Ptr(y.as_ref().map_or(self.dummy.ptr, |y| y.ptr))),
            ("a", Arg::Ptr(norm.as_ref().map_or(self.dummy.ptr, |n| n.3.ptr))),
            ("proj", Arg::Ptr(proj.ptr)),
            ("counters", Arg::Ptr(self.hc_counters.ptr)),
            ("x", Arg::Ptr(x.ptr())),
            ("w", Arg::Ptr(w.ptr)),
            ("scale", Arg::Ptr(self.weights.vector(&c.scale)?.ptr)),
            ("base", Arg::Ptr(self.weights.vector(&c.base)?.ptr)),
            ("norm_w", Arg::Ptr(norm.as_ref().map_or(self.dummy.ptr, |n| n.1))),
            ("nh", u(c.nh)),
            ("d", u(d)),
            ("iters", u(c.iters)),
            ("eps_norm", Arg::F32(eps)),
            ("eps_mix", Arg::F32(c.eps_mix)),
            ("has_norm", u(norm.is_some() as usize)),
            ("eps_a", Arg::F32(norm.as_ref().map_or(0.0, |n| n.2))),
            ("comb", u(home.is_none() as usize)),
            ("sy", Arg::Ptr(later.as_ref().map_or(self.dummy.ptr, |l| l.y.ptr()))),
            ("smix", Arg::Ptr(later.as_ref().map_or(self.dummy.ptr, |l| l.mix.ptr()))),
            ("xo", Arg::Ptr(whole.as_ref().map_or(self.dummy.ptr, |b| b.ptr))),
            ("pending", u(later.is_some() as usize)),
        ];
        // The shared expert's lane (which made the share) joins here.
        if later.is_some() {
            self.join()?;
        }
        self.call(cuda_hc_pre::NAME, ((mw + cuda_hc_pre::router_blocks(r_rows)) as u32, tokens as u32), &named)?;
        if let Some(home) = home {
            self.launch_comb()?;
            self.comb_pending.replace(Some(CombPending { home, chain: c, proj, mix: mix.ptr, tokens }));
        }
        // The collapse read by nothing but the norm made here: not kept (the launch may not
        // write it, `cuda_hc_pre::params`).
        let collapse = match y.filter(|_| norm.is_none()) {
            Some(y) => GVal::F(DevSlice::whole(y, tokens * d)),
            None => GVal::Freed,
        };
        let mut made = vec![(c.proj.index(), GVal::Freed), (c.mix.index(), GVal::F(DevSlice::whole(mix, tokens * mw))), (c.collapse.index(), collapse)];
        if let Some((_, _, parts)) = router {
            made.push((parts.logits, GVal::Freed));
            self.router_parts.replace(Some(parts));
        }
        if let Some((id, _, _, a)) = norm {
            made.push((id.index(), GVal::F(DevSlice::whole(a, tokens * d))));
        }
        // The streams made whole: their node's value from now on (`run_nodes`).
        if let Some(whole) = whole {
            made.push((c.streams.index(), GVal::F(DevSlice::whole(whole, tokens * n))));
        }
        Ok(Some(made))
    }

    /// The pre chain at norm node `norm` where it runs as one `hc_pre` launch for `tokens`
    /// tokens of streams of `n` floats (16-byte aligned, which `hc_pre` checks): a decode's
    /// few tokens, an F16 projection, a mix that fits a warp; `DS4_HC_PRE=0`: never. With
    /// the projection's weight.
    pub(super) fn hc_pre_takes(&self, norm: ds4_ir::NodeId, tokens: usize, n: usize) -> Result<Option<(&'a super::super::hc_pre::HcPreChain, &'a DeviceTensor)>, ExecError> {
        self.chain_takes(self.plan.hc_pre(norm), tokens, n)
    }

    /// `hc_pre_takes` for a chain already looked up (`hc_pre` looks it up once a launch).
    fn chain_takes(&self, chain: Option<&'a super::super::hc_pre::HcPreChain>, tokens: usize, n: usize) -> Result<Option<(&'a super::super::hc_pre::HcPreChain, &'a DeviceTensor)>, ExecError> {
        let Some(c) = chain else { return Ok(None) };
        if switched_off!("DS4_HC_PRE") || !self.kernels.by_name.contains_key(cuda_hc_pre::NAME) {
            return Ok(None);
        }
        let w = self.weights.tensor(&c.w)?;
        let fits = n.is_multiple_of(c.nh) && cuda_hc_pre::fits(c.nh, n / c.nh, tokens) && w.ty == ds4_ir::GgmlType::F16;
        Ok(fits.then_some((c, w)))
    }

    /// The router mat-vec an `hc_pre` launch of chain `c` (`tokens` tokens, streams of `d`,
    /// its mix at `mix`) makes as parts (`cuda_hc_pre::router_blocks`; `DS4_HC_ROUTER=0`:
    /// never), where the routing after it runs as the one launch that can add them
    /// (`routing_launch`): its F16 weight's address, its rows, and the parts' buffers for
    /// `router_select`.
    fn router_part(&self, c: &super::super::hc_pre::HcPreChain, tokens: usize, d: usize, mix: u64) -> Result<Option<(u64, usize, RouterParts)>, ExecError> {
        let Some((m, scores, w)) = &c.router else { return Ok(None) };
        if switched_off!("DS4_HC_ROUTER") || c.norm.is_none() {
            return Ok(None);
        }
        let w = self.weights.tensor(w)?;
        let rows = w.ne.get(1).copied().unwrap_or(0) as usize;
        let fits = w.ty == ds4_ir::GgmlType::F16 && w.ne.first() == Some(&(d as u64)) && w.ptr.is_multiple_of(16) && d.is_multiple_of(4);
        if !fits || self.routing_launch(*scores, tokens, rows).is_none() {
            return Ok(None);
        }
        let parts = RouterParts { logits: m.index(), parts: self.dev.alloc(tokens * rows * c.nh * 4)?, inv: self.dev.alloc(tokens * 4)?, mix, nh: c.nh, mw: ds4_ir::kernels::hc::mix_width(c.nh) };
        Ok(Some((w.ptr, rows, parts)))
    }

    /// A Sinkhorn's values in `cuda_hc_pre::comb_params`' order, named by `params` (those or
    /// `ride_params`); none (`cnh` 0, placeholders) where `p` is None.
    pub(super) fn comb_args(&self, p: Option<&CombPending>, params: &[ds4_codegen::quant::QParam]) -> Result<NamedArgs, ExecError> {
        let d = self.dummy.ptr;
        let values = match p {
            Some(p) => {
                let c = p.chain;
                let (scale, base) = (self.weights.vector(&c.scale)?.ptr, self.weights.vector(&c.base)?.ptr);
                [Arg::Ptr(p.mix), Arg::Ptr(p.proj.ptr), Arg::Ptr(scale), Arg::Ptr(base), Arg::U64(c.nh as u64), Arg::U64(c.iters as u64), Arg::F32(c.eps_mix)]
            }
            None => [Arg::Ptr(d), Arg::Ptr(d), Arg::Ptr(d), Arg::Ptr(d), Arg::U64(0), Arg::U64(0), Arg::F32(0.0)],
        };
        Ok(params.iter().map(|q| q.name()).zip(values).collect())
    }

    /// The Sinkhorn arguments of a dense mat-vec launch of `tokens` tokens
    /// (`cuda_hc_pre::ride_params`): a pending `CombHome::Ride` one's, taken, and true; or
    /// none and false.
    pub(super) fn ride_args(&self, tokens: usize) -> Result<(NamedArgs, bool), ExecError> {
        let ride = self.comb_pending.borrow().as_ref().is_some_and(|p| p.home == CombHome::Ride && p.tokens == tokens);
        let p = if ride { self.comb_pending.take() } else { None };
        Ok((self.comb_args(p.as_ref(), &cuda_hc_pre::ride_params())?, ride))
    }

    /// Launches the Sinkhorn an `hc_pre` launch left (`comb_pending`), if any, on the lane
    /// the executor is on.
    pub(super) fn launch_comb(&self) -> Result<(), ExecError> {
        let Some(p) = self.comb_pending.take() else { return Ok(()) };
        let named = self.comb_args(Some(&p), &cuda_hc_pre::comb_params())?;
        self.call(cuda_hc_pre::HC_COMB, (p.tokens as u32, 1), &named)
    }

    /// The `hc_expand` (`fusion_plan`'s `expand`) whose y is node `y`, a decode token's
    /// `d` values, for the launch that makes y to make too: None where the plan has none,
    /// `DS4_EXPAND=0`, or its streams and mix are not a token's floats.
    pub(super) fn expand_to(&self, y: ds4_ir::NodeId, vals: &HashMap<usize, GVal>, d: usize) -> Result<Option<ExpandTo>, ExecError> {
        let Some(node) = self.plan.expand(y).filter(|_| !switched_off!("DS4_EXPAND")) else { return Ok(None) };
        let Op::HcExpand { nh } = self.graph.node(node).op else { return Ok(None) };
        let ins = self.graph.inputs(node);
        let (Some(GVal::F(r)), Some(GVal::F(mix))) = (vals.get(&ins[1].index()), vals.get(&ins[2].index())) else { return Ok(None) };
        if r.len != nh * d || mix.len != ds4_ir::kernels::hc::mix_width(nh) {
            return Ok(None);
        }
        // A Sinkhorn still pending for this mix first.
        if self.comb_pending.borrow().as_ref().is_some_and(|p| p.mix == mix.ptr()) {
            self.launch_comb()?;
        }
        Ok(Some(ExpandTo { node, len: nh * d, r: r.ptr(), mix: mix.clone(), nh }))
    }

    /// The expand a launch takes (None: none), with its new streams allocated.
    pub(super) fn take_expand<'e>(&self, e: Option<&'e ExpandTo>) -> Result<Option<ExpandOut<'e>>, ExecError> {
        e.map(|e| Ok((e, self.dev.alloc(e.len * 4)?))).transpose()
    }

    /// Whether the shared expert's y `s` (its add `add` expanded by `e`, `tokens` tokens)
    /// may be left out of the expand for the next `hc_pre` to add (`cuda_hc_pre`'s
    /// `pending`): where the plan offers it (`shared_later`), the next chain runs as an
    /// `hc_pre` launch, and `DS4_SHARED_LATER` is not 0. What to hold for it if so.
    pub(super) fn shared_later(&self, add: ds4_ir::NodeId, s: &DevSlice, e: &ExpandTo, tokens: usize) -> Result<Option<SharedLater>, ExecError> {
        let Some(norm) = self.plan.shared_later(add).filter(|_| !switched_off!("DS4_SHARED_LATER")) else { return Ok(None) };
        if self.hc_pre_takes(norm, tokens, e.len)?.is_none() {
            return Ok(None);
        }
        Ok(Some(SharedLater { streams: e.node.index(), y: s.clone(), mix: e.mix.clone() }))
    }

    /// A launch's expand arguments (`cuda_hc_expand::params`; `enh` 0 for none).
    pub(super) fn expand_args(&self, e: Option<&ExpandOut>) -> [(&'static str, Arg); 4] {
        let e = e.map(|(e, out)| (*e, out.ptr));
        [
            ("eout", Arg::Ptr(e.map_or(self.dummy.ptr, |(_, out)| out))),
            ("er", Arg::Ptr(e.map_or(self.dummy.ptr, |(e, _)| e.r))),
            ("emix", Arg::Ptr(e.map_or(self.dummy.ptr, |(e, _)| e.mix.ptr()))),
            ("enh", Arg::U64(e.map_or(0, |(e, _)| e.nh as u64))),
        ]
    }
}
