"""Expert parallelism (EP) for moeblaze on torch.distributed: each rank of the expert-parallel
group holds E / ep_size experts; tokens travel to their experts' ranks and back with
all_to_all_single (NCCL, or gloo for tests).

Forward, per rank (see _dispatch for the order of the rows):
  1. route locally (the caller's top-k, or this module's router);
  2. exchange the per-(rank, expert) counts, one device-to-host copy for the split sizes;
  3. all_to_all the token rows and their gates, sorted by (chunk, destination expert);
  4. run the local experts on the received rows (moeblaze with caller routing, K = 1: the
     index arrays are built from the received expert ids);
  5. all_to_all the rows g*o back;
  6. combine each token's K rows in (token, k) order (float32 accumulation, one rounding).
Backward is the mirror image: dy rows out, moeblaze's backward on the received rows (dx rows,
gate gradients, weight gradients of the local experts), dx rows and gate gradients back, the
token gradient summed in (token, k) order.

Overlap: with chunks = C the local experts are split into C groups; every chunk's dispatch
is started at once (NCCL runs them in order on its own stream) and each chunk's rows go back
as soon as its compute is done, so the exchanges of the other chunks run under a chunk's
compute, in forward and backward. Chunking by expert (not by token) keeps each expert's rows
in one compute call, so the weight-gradient reduction, and every other result, is the same
bit for bit for any chunk count and any number of ranks.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch
from torch import Tensor

from . import _capi as C
from ._dispatch import (DispatchPlan, HostSplits, check_layout, chunk_experts, gather_sum, leave_out_bad_ids,
                        plan_dispatch, received_expert_ids, scatter_slots)
from ._ep_checks import EXCHANGES, agree_on_layout, exchange_counts, layout_values
from ._exchange import Exchange
from .ep_experts import MoeblazeExperts, TorchExperts
from .reference import route as _route


class EPOutput(NamedTuple):
    y: Tensor              # [T, d]
    expert_counts: Tensor  # int32 [E]: this rank's slots per global expert (load-balancing losses)
    gates: Tensor          # [T, K]: the router's gates (empty with caller routing)


class _Step:
    """What one EP layer call needs besides tensors (passed through autograd as one object)."""

    def __init__(self, exchange: Exchange, engine, plan: DispatchPlan, splits: HostSplits, recv_counts: Tensor):
        self.exchange, self.engine, self.plan = exchange, engine, plan
        self.splits, self.recv_counts = splits, recv_counts


def _chunk_weights(w1, w3, w2, lo: int, hi: int):
    return w1[lo:hi], (w3[lo:hi] if w3 is not None else None), w2[lo:hi]


class _ExpertParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, gates, w1, w3, w2, step: _Step):
        ex, plan, splits, engine = step.exchange, step.plan, step.splits, step.engine
        chunks, local = plan.chunks, plan.experts_local
        x_send = x.index_select(0, plan.send_tokens())
        g_send = gates.reshape(-1).index_select(0, plan.order)
        # Every dispatch first: NCCL runs them back to back on its stream while chunks compute.
        inflight = []
        for c in range(chunks):
            s0, s1 = splits.send_range(c)
            inflight.append((ex.rows(x_send[s0:s1], splits.recv[c], splits.send[c]),
                             ex.rows(g_send[s0:s1], splits.recv[c], splits.send[c])))
        back = torch.empty_like(x_send)
        returns, states = [], []
        for c in range(chunks):
            rows, g = inflight[c][0].wait(), inflight[c][1].wait()
            inflight[c] = None
            lo, hi = chunk_experts(local, chunks, c)
            if rows.shape[0]:
                ids = received_expert_ids(step.recv_counts, c, chunks, rows.shape[0])
                out, state = engine.forward(rows, ids, g, *_chunk_weights(w1, w3, w2, lo, hi))
            else:
                out, state = rows, None
            states.append(state)
            s0, s1 = splits.send_range(c)
            returns.append(ex.rows(out, splits.send[c], splits.recv[c], out=back[s0:s1]))
        del x_send, g_send
        for r in returns:
            r.wait()
        ctx.step, ctx.states = step, states
        ctx.x_meta = (x.shape, x.dtype)
        ctx.gate_dtype = gates.dtype
        ctx.w_meta = [None if w is None else (tuple(w.shape[1:]), w.dtype, w.device) for w in (w1, w3, w2)]
        ctx.set_materialize_grads(False)
        return gather_sum(back, plan.position, x.dtype)

    @staticmethod
    def backward(ctx, dy):
        if dy is None:
            return (None,) * 6
        if ctx.states is None:
            raise RuntimeError("moeblaze.ep: this forward was already backpropagated (its saved state is consumed); "
                               "run the forward again instead of retain_graph=True")
        step, states = ctx.step, ctx.states
        ctx.states = None
        ex, plan, splits, engine = step.exchange, step.plan, step.splits, step.engine
        chunks, local = plan.chunks, plan.experts_local
        dy_send = dy.contiguous().index_select(0, plan.send_tokens())
        inflight = []
        for c in range(chunks):
            s0, s1 = splits.send_range(c)
            inflight.append(ex.rows(dy_send[s0:s1], splits.recv[c], splits.send[c]))
        dx_back = torch.empty_like(dy_send)
        dg_back = torch.empty(plan.slots, dtype=ctx.gate_dtype, device=dy.device)
        dws = [[], [], []]
        returns = []
        for c in range(chunks):
            d_rows = inflight[c].wait()
            inflight[c] = None
            lo, hi = chunk_experts(local, chunks, c)
            if states[c] is not None:
                d_x, d_g, *d_w = engine.backward(states[c], d_rows)
                states[c] = None
            else:
                d_x = d_rows
                d_g = torch.empty(0, dtype=ctx.gate_dtype, device=dy.device)
                d_w = [None if m is None else torch.zeros((hi - lo,) + m[0], dtype=m[1], device=m[2])
                       for m in ctx.w_meta]
            for acc, g in zip(dws, d_w):
                acc.append(g)
            s0, s1 = splits.send_range(c)
            returns.append(ex.rows(d_x, splits.send[c], splits.recv[c], out=dx_back[s0:s1]))
            returns.append(ex.rows(d_g, splits.send[c], splits.recv[c], out=dg_back[s0:s1]))
        del dy_send
        for r in returns:
            r.wait()
        x_shape, x_dtype = ctx.x_meta
        dx = gather_sum(dx_back, plan.position, x_dtype)
        dgates = scatter_slots(dg_back, plan.position)
        dw = [None if parts[0] is None else parts[0] if len(parts) == 1 else torch.cat(parts) for parts in dws]
        return dx, dgates, dw[0], dw[1], dw[2], None


def _check_args(x, topk_ids, topk_weights, w1, w3, w2, num_experts, world):
    if x.dim() != 2:
        raise C.InvalidArgument("x", f"x: must be [T, d], got shape {list(x.shape)}")
    T, d = x.shape
    if topk_ids.dim() != 2 or topk_ids.shape[0] != T:
        raise C.InvalidArgument("topk_ids", f"topk_ids: must be [T={T}, K], got shape {list(topk_ids.shape)}")
    K = topk_ids.shape[1]
    if tuple(topk_weights.shape) != (T, K):
        raise C.InvalidArgument("topk_weights", f"topk_weights: has shape {list(topk_weights.shape)}, expected "
                                f"{[T, K]} like topk_ids")
    if not topk_weights.dtype.is_floating_point:
        raise C.InvalidArgument("topk_weights", f"topk_weights: must be floating point, got {topk_weights.dtype}")
    if num_experts < 1 or num_experts % world:
        raise C.InvalidArgument("num_experts", f"num_experts: {num_experts} experts do not shard evenly over "
                                f"{world} ranks")
    local = num_experts // world
    if w1.dim() != 3 or w1.shape[0] != local or w1.shape[2] != d:
        raise C.InvalidArgument("w1", f"w1: must be this rank's experts [{local}, n, {d}], got {list(w1.shape)}")
    n = w1.shape[1]
    if w3 is not None and w3.shape != w1.shape:
        raise C.InvalidArgument("w3", f"w3: has shape {list(w3.shape)}, expected {list(w1.shape)} like w1")
    if tuple(w2.shape) != (local, d, n):
        raise C.InvalidArgument("w2", f"w2: has shape {list(w2.shape)}, expected {[local, d, n]}")
    for name, t in (("topk_ids", topk_ids), ("topk_weights", topk_weights), ("w1", w1), ("w3", w3), ("w2", w2)):
        if t is not None and t.device != x.device:
            raise C.InvalidArgument(name, f"{name}: is on {t.device}, expected {x.device} like x")


def default_engine(x: Tensor, activation: str, checkpoint: str = "save-h", tiles: str = "tuned"):
    """moeblaze's kernels for CUDA tensors, the plain-PyTorch compute elsewhere."""
    return MoeblazeExperts(activation, checkpoint, tiles) if x.is_cuda else TorchExperts(activation)


def ep_moe(x: Tensor, w1: Tensor, w3: Optional[Tensor], w2: Tensor, topk_ids: Tensor, topk_weights: Tensor, *,
           num_experts: int, group=None, chunks: int = 1, engine=None, activation: str = "swiglu",
           checkpoint: str = "save-h", tiles: str = "tuned", exchange: str = "all_to_all",
           max_tokens: Optional[int] = None) -> EPOutput:
    """The expert-parallel MoE layer, functional form with caller routing.

    x [T, d] this rank's tokens; topk_ids [T, K] global expert ids; topk_weights [T, K] gates
    (their gradient flows back); w1, w3 [E_local, n, d], w2 [E_local, d, n] this rank's experts
    (global experts rank*E_local .. (rank+1)*E_local - 1). group: the expert-parallel process
    group (default: the world). chunks: local expert groups whose exchanges overlap the
    others' compute (E_local % chunks == 0). engine: the local expert compute (default:
    moeblaze for CUDA tensors, see ep_experts). Every rank of the group must call it (with
    any T, including 0).

    exchange="all_to_all" (default): all_to_all_single over the group (NCCL, or gloo), split
    sizes on the host: one device-to-host copy of the counts per call. "symm_mem": split sizes
    stay on the device (NVSHMEM all_to_all_vdev, no host sync, CUDA-graph capturable; needs
    max_tokens, the most tokens any rank passes, and chunks=1; see ep_symm).

    Bad input stops every rank, never one alone (which would leave the others waiting in the
    next collective): at the first call of a layout the ranks compare E, the experts each
    holds, K, chunks, d, the exchange and the dtypes of x and topk_weights (one all_gather),
    and every rank raises InvalidArgument naming what differs; with exchange="all_to_all", an
    id outside [0, E) or a bad argument on any rank raises InvalidArgument on every rank at
    the counts exchange, before any row travels. exchange="symm_mem" cannot raise without a
    host sync: there such ids are left out (gate 0, no output, gate gradient 0)."""
    ex = Exchange(group)
    device = topk_ids.device if isinstance(topk_ids, Tensor) else torch.device("cpu")
    agree_on_layout(ex, layout_values(x, topk_ids, topk_weights, w1, num_experts, chunks, exchange), device)
    # From here on the ranks agree on these, so an error in them is raised by every rank alike.
    if exchange not in EXCHANGES:
        raise C.InvalidArgument("exchange", f"exchange: '{exchange}' is not one of {', '.join(EXCHANGES)}")
    local = check_layout(num_experts, ex.world, chunks)
    if engine is None:
        engine = default_engine(x, activation, checkpoint, tiles)
    if exchange == "symm_mem":
        from .ep_symm import ep_step_device
        _check_args(x, topk_ids, topk_weights, w1, w3, w2, num_experts, ex.world)
        if max_tokens is None:
            raise C.InvalidArgument("max_tokens", "max_tokens: the symm_mem exchange sizes its buffers by the most "
                                    "tokens a rank passes; give it")
        ids, weights = leave_out_bad_ids(topk_ids, topk_weights, num_experts, ex.rank * local)
        plan = plan_dispatch(ids, num_experts, ex.world, chunks)
        y = ep_step_device(x, weights, w1, w3, w2, plan, group, engine, max_tokens)
        return EPOutput(y, plan.send_counts.reshape(-1).to(torch.int32), topk_weights.new_empty(0))
    try:  # this rank's own errors travel in the counts exchange's status column
        _check_args(x, topk_ids, topk_weights, w1, w3, w2, num_experts, ex.world)
        plan, error = plan_dispatch(topk_ids, num_experts, ex.world, chunks), None
    except C.InvalidArgument as e:
        plan, error = None, e
    recv_counts, splits = exchange_counts(ex, plan, error, num_experts, local, chunks, device)
    step = _Step(ex, engine, plan, splits, recv_counts)
    y = _ExpertParallel.apply(x, topk_weights, w1, w3, w2, step)
    return EPOutput(y, plan.send_counts.reshape(-1).to(torch.int32), topk_weights.new_empty(0))


def ep_group_of(mesh=None, ep_dim: Optional[str] = None, group=None):
    """The expert-parallel process group: `group`, or `mesh`'s `ep_dim` (a 1-D mesh: its
    only dimension)."""
    if group is not None and mesh is not None:
        raise C.InvalidArgument("mesh", "mesh: pass either ep_group or mesh (and ep_dim), not both")
    if mesh is None:
        return group
    if ep_dim is None:
        if mesh.ndim != 1:
            raise C.InvalidArgument("ep_dim", f"ep_dim: the mesh has {mesh.ndim} dimensions "
                                    f"{mesh.mesh_dim_names}; name the expert-parallel one")
        return mesh.get_group()
    return mesh.get_group(ep_dim)


class EPExperts(torch.nn.Module):
    """This rank's experts (w1, w3 [E_local, n, d], w2 [E_local, d, n]) and the exchange
    around them; called with the routing. A module of its own so that FSDP2 can shard it on
    another mesh dimension than the rest of the layer (fully_shard_ep)."""

    def __init__(self, num_experts: int, experts_local: int, hidden: int, ffn: int, gated: bool, group,
                 chunks: int, engine, device=None, dtype=torch.bfloat16, exchange: str = "all_to_all",
                 max_tokens: Optional[int] = None):
        super().__init__()
        self.num_experts, self.group, self.chunks, self.engine = num_experts, group, chunks, engine
        self.exchange, self.max_tokens = exchange, max_tokens
        kw = dict(device=device, dtype=dtype)
        self.w1 = torch.nn.Parameter(torch.empty(experts_local, ffn, hidden, **kw))
        self.w3 = torch.nn.Parameter(torch.empty(experts_local, ffn, hidden, **kw)) if gated else None
        self.w2 = torch.nn.Parameter(torch.empty(experts_local, hidden, ffn, **kw))

    def forward(self, x: Tensor, topk_ids: Tensor, topk_weights: Tensor) -> EPOutput:
        return ep_moe(x, self.w1, self.w3, self.w2, topk_ids, topk_weights, num_experts=self.num_experts,
                      group=self.group, chunks=self.chunks, engine=self.engine, exchange=self.exchange,
                      max_tokens=self.max_tokens)


class EPMoE(torch.nn.Module):
    """The MoE layer with its experts sharded over an expert-parallel group: the layer of
    moeblaze.torch.MoE (same weight layout, router and options) where this rank holds experts
    [rank E/ep, (rank+1) E/ep). ep_group, or mesh (a DeviceMesh) and ep_dim, name the group;
    default: the world. chunks: see ep_moe. engine: the local expert compute (default:
    moeblaze on CUDA, plain PyTorch elsewhere). exchange, max_tokens: see ep_moe. With
    router=None, forward takes topk_ids (global ids) and topk_weights."""

    def __init__(self, num_experts: int, top_k: int, hidden: int, ffn: int, *, ep_group=None, mesh=None,
                 ep_dim: Optional[str] = None, activation: str = "swiglu", router: Optional[str] = "softmax",
                 renormalize: bool = False, route_scale: float = 1.0, checkpoint: str = "save-h", chunks: int = 1,
                 tiles: str = "tuned", engine=None, exchange: str = "all_to_all", max_tokens: Optional[int] = None,
                 device=None, dtype=torch.bfloat16):
        super().__init__()
        import torch.distributed as dist
        if exchange not in EXCHANGES:
            raise C.InvalidArgument("exchange", f"exchange: '{exchange}' is not one of {', '.join(EXCHANGES)}")
        if activation not in C.ACTIVATIONS:
            raise C.InvalidArgument("activation", f"activation: '{activation}' is not one of {sorted(C.ACTIVATIONS)}")
        if router not in C.ROUTERS:
            raise C.InvalidArgument("router", f"router: '{router}' is not one of softmax, sigmoid, None")
        group = ep_group_of(mesh, ep_dim, ep_group)
        world = dist.get_world_size(group)
        self.ep_rank = dist.get_rank(group)
        if num_experts % world:
            raise C.InvalidArgument("num_experts", f"num_experts: {num_experts} experts do not shard evenly over "
                                    f"{world} ranks")
        local = num_experts // world
        if chunks < 1 or local % chunks:
            raise C.InvalidArgument("chunks", f"chunks: {local} local experts do not split into {chunks} equal chunks")
        if not 1 <= top_k <= num_experts:
            raise C.InvalidArgument("top_k", f"top_k: {top_k} is outside [1, {num_experts}]")
        dev = torch.device(device) if device is not None else torch.device("cpu")
        if engine is None:
            engine = (MoeblazeExperts(activation, checkpoint, tiles) if dev.type == "cuda"
                      else TorchExperts(activation))
        self.num_experts, self.top_k, self.hidden, self.ffn = num_experts, top_k, hidden, ffn
        self.activation, self.router, self.renormalize, self.route_scale = activation, router, renormalize, route_scale
        self.experts = EPExperts(num_experts, local, hidden, ffn, activation in ("swiglu", "geglu"), group, chunks,
                                 engine, device, dtype, exchange, max_tokens)
        self.gate = torch.nn.Linear(hidden, num_experts, bias=False, device=device, dtype=dtype) if router else None
        if router == "sigmoid":
            self.register_buffer("e_score_correction_bias", torch.zeros(num_experts, device=device,
                                                                        dtype=torch.float32))
        else:
            self.e_score_correction_bias = None
        self.reset_parameters()

    @property
    def expert_range(self) -> tuple:
        local = self.experts.w1.shape[0]
        return self.ep_rank * local, (self.ep_rank + 1) * local

    def reset_parameters(self):
        d, n = self.hidden, self.ffn
        with torch.no_grad():
            for w, fan_in in ((self.experts.w1, d), (self.experts.w3, d), (self.experts.w2, n)):
                if w is not None:
                    w.uniform_(-(3.0 / fan_in) ** 0.5, (3.0 / fan_in) ** 0.5)
            if self.gate is not None:
                self.gate.weight.uniform_(-(3.0 / d) ** 0.5, (3.0 / d) ** 0.5)

    @torch.no_grad()
    def load_experts(self, w1: Tensor, w3: Optional[Tensor], w2: Tensor) -> None:
        """Copies this rank's experts out of the full [E, ...] weights (e.g. a checkpoint)."""
        lo, hi = self.expert_range
        for name, dst, src in (("w1", self.experts.w1, w1), ("w3", self.experts.w3, w3), ("w2", self.experts.w2, w2)):
            if dst is None:
                continue
            if src is None or src.shape[0] != self.num_experts or tuple(src.shape[1:]) != tuple(dst.shape[1:]):
                raise C.InvalidArgument(name, f"{name}: expected the full [{self.num_experts}, "
                                        f"{', '.join(map(str, dst.shape[1:]))}] weights")
            dst.copy_(src[lo:hi])

    def forward(self, hidden_states: Tensor, topk_ids: Optional[Tensor] = None,
                topk_weights: Optional[Tensor] = None) -> EPOutput:
        lead = hidden_states.shape[:-1]
        x = hidden_states.reshape(-1, hidden_states.shape[-1])
        gates = x.new_empty(0, dtype=torch.float32)
        if self.router is not None:
            if topk_ids is not None:
                raise C.InvalidArgument("topk_ids", "topk_ids: given, but the layer routes itself (router is set)")
            topk_ids, topk_weights = _route(x, self.gate.weight, self.top_k, self.router, self.renormalize,
                                            self.route_scale, self.e_score_correction_bias)
            gates = topk_weights
        elif topk_ids is None or topk_weights is None:
            raise C.InvalidArgument("topk_ids", "topk_ids: a layer without router needs topk_ids and topk_weights")
        out = self.experts(x, topk_ids, topk_weights)
        return EPOutput(out.y.reshape(*lead, out.y.shape[-1]), out.expert_counts, gates)

    def extra_repr(self) -> str:
        lo, hi = self.expert_range
        return (f"experts={self.num_experts} (this rank: {lo}..{hi - 1}), top_k={self.top_k}, hidden={self.hidden}, "
                f"ffn={self.ffn}, activation={self.activation}, router={self.router}, chunks={self.experts.chunks}")


def fully_shard_ep(module: EPMoE, mesh, dp_dim: str = "dp", ep_dim: str = "ep", **fsdp_kwargs) -> EPMoE:
    """FSDP2 on a 2-D (dp, ep) DeviceMesh, as torchtitan composes them: the experts are
    sharded by EP over `ep_dim` (the module's group must be mesh[ep_dim]'s) and by FSDP over
    `dp_dim`; the rest of the layer (the router) is data parallel over every rank and sharded
    by FSDP over the flattened mesh. Expert gradients are divided by the number of ranks, like
    the router's: each rank's loss is taken as its tokens' share of a global mean."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    if mesh.ndim != 2 or set(mesh.mesh_dim_names or ()) != {dp_dim, ep_dim}:
        raise C.InvalidArgument("mesh", f"mesh: needs the two dimensions ({dp_dim}, {ep_dim}), got "
                                f"{mesh.mesh_dim_names}")
    ep_group = mesh.get_group(ep_dim)
    if dist.get_process_group_ranks(ep_group) != dist.get_process_group_ranks(module.experts.group or
                                                                              dist.group.WORLD):
        raise C.InvalidArgument("mesh", f"mesh: the layer's expert-parallel group is not mesh['{ep_dim}']")
    fully_shard(module.experts, mesh=mesh[dp_dim], **fsdp_kwargs)
    module.experts.set_gradient_divide_factor(float(mesh.size()))
    fully_shard(module, mesh=mesh[(dp_dim, ep_dim)]._flatten(), **fsdp_kwargs)
    return module
