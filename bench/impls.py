"""The suite's implementations, each built as a forward callable on one case's shared inputs:
moeblaze (save-h, recompute) through the Python binding, the peers SonicMoE and MegaBlocks
(bench/peers.py), and the PyTorch baselines (bench/baselines.py).

Routing (the table says the same):
- random: every impl routes from the same x and router weights inside its timed forward.
  moeblaze uses the preset's router, SonicMoE its own softmax over the top-k logits (that is
  softmax top-k renormalised over the picks), MegaBlocks and the torch baselines
  moeblaze.reference.route (fp32). Top-k of the same logits picks the same experts whatever
  the gate function (softmax and sigmoid are monotonic, renormalising rescales the picks), so
  every impl gets the same expert loads up to near-ties (SonicMoE's logits are bf16); only the
  gate values differ where a preset's router is not renormalised softmax (olmoe, deepseek-v3),
  which changes no GEMM's work.
- skewed: one fixed routing (ids, weights) goes to every impl as caller routing; SonicMoE takes
  it through moe_general_routing_inputs (its caller-routing entry, variable K per token)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

import torch

import moeblaze.torch as mbt
import peers
from baselines import torch_grouped_mm, torch_loop
from moeblaze.reference import route

ROUTERS = {  # the presets' routers (generator/layer_config.cpp): kind, renormalise, route scale
    "mixtral-8x7b": ("softmax", True, 1.0), "gpt-oss-20b": ("softmax", True, 1.0),
    "olmoe-1b-7b": ("softmax", False, 1.0), "qwen3-30b-a3b": ("softmax", True, 1.0),
    "deepseek-v3": ("sigmoid", True, 2.5), "qwen3-next-80b": ("softmax", True, 1.0),
}
# The held-out shapes (bench/heldout.json) take one router, so that their runs compare the
# experts' GEMMs and not routers: softmax top-k, renormalised.
HELDOUT_ROUTER = ("softmax", True, 1.0)


def router_of(name):
    return ROUTERS.get(name, HELDOUT_ROUTER)


class Unavailable(Exception):
    """The impl cannot run here (a peer missing or failing to load); the message says why."""


@dataclass
class Inputs:
    shape: dict
    routing: str
    tokens: int
    x: torch.Tensor
    dy: torch.Tensor
    w1: torch.Tensor
    w3: torch.Tensor
    w2: torch.Tensor
    wr: torch.Tensor
    fixed: Optional[Tuple[torch.Tensor, torch.Tensor]]  # skewed routing: ids int32 [T,K], weights f32 [T,K]
    router_bias: Optional[torch.Tensor]


@dataclass
class Impl:
    forward: Callable[[], torch.Tensor]
    params: List[torch.Tensor]  # weights whose gradients are left out of the peak
    leaves: List[torch.Tensor]  # every tensor whose .grad a step resets
    routing_path: str


def skewed_routing(T, E, K, gen):
    """A few hot experts (E/16) drawn 4x as often as the others; gates softmax-normalised."""
    hot = max(1, E // 16)
    p = torch.ones(E, device="cuda")
    p[:hot] = 4.0
    ids = torch.multinomial(p.expand(T, E), K, replacement=False, generator=gen).int()
    w = torch.rand(T, K, device="cuda", generator=gen).softmax(-1)
    return ids, w


def make_inputs(shape: dict, routing: str, T: int) -> Inputs:
    """Seeded uniform weights at the fan-in scale, normal x and dy: the same for every impl."""
    E, K, d, n = shape["E"], shape["K"], shape["d"], shape["n"]
    gen = torch.Generator(device="cuda").manual_seed(0)

    def uniform(*size, fan_in):
        return (torch.rand(*size, generator=gen, device="cuda") * 2 - 1).mul_((3 / fan_in) ** 0.5).to(torch.bfloat16)

    w1 = uniform(E, n, d, fan_in=d).requires_grad_()
    w3 = uniform(E, n, d, fan_in=d).requires_grad_()
    w2 = uniform(E, d, n, fan_in=n).requires_grad_()
    wr = uniform(E, d, fan_in=d).requires_grad_()
    x = torch.randn(T, d, generator=gen, device="cuda", dtype=torch.bfloat16).requires_grad_()
    dy = torch.randn(T, d, generator=gen, device="cuda", dtype=torch.bfloat16)
    fixed = None
    if routing == "skewed":
        ids, w = skewed_routing(T, E, K, gen)
        fixed = (ids, w.requires_grad_())
    bias = torch.zeros(E, device="cuda") if router_of(shape["name"])[0] == "sigmoid" else None
    return Inputs(shape, routing, T, x, dy, w1, w3, w2, wr, fixed, bias)


def _reference_routing(inp: Inputs):
    router, renorm, scale = router_of(inp.shape["name"])
    return route(inp.x, inp.wr, inp.shape["K"], router, renorm, scale, inp.router_bias)


def _moeblaze(inp: Inputs, mode: str) -> Impl:
    router, renorm, scale = router_of(inp.shape["name"])
    w1, w3, w2, wr, x = inp.w1, inp.w3, inp.w2, inp.wr, inp.x
    if inp.fixed is None:
        def forward():
            return mbt.moe(x, w1, w3, w2, w_router=wr, router=router, top_k=inp.shape["K"], router_bias=inp.router_bias,
                           renormalize=renorm, route_scale=scale, checkpoint=mode).y
        path = f"own router ({router} top-k{', renormalised' if renorm else ''}{f', x{scale:g}' if scale != 1 else ''})"
        leaves = [w1, w3, w2, wr, x]
    else:
        ids, w = inp.fixed

        def forward():
            return mbt.moe(x, w1, w3, w2, topk_ids=ids, topk_weights=w, checkpoint=mode).y
        path = "caller routing"
        leaves = [w1, w3, w2, wr, x, w]
    return Impl(forward, [w1, w3, w2, wr], leaves, path)


def _torch_baseline(inp: Inputs, fn) -> Impl:
    w1, w3, w2, x = inp.w1, inp.w3, inp.w2, inp.x

    def forward():
        ids, w = inp.fixed if inp.fixed is not None else _reference_routing(inp)
        return fn(x, ids, w, w1, w3, w2)
    leaves = [w1, w3, w2, inp.wr, x] + ([inp.fixed[1]] if inp.fixed is not None else [])
    path = "caller routing" if inp.fixed is not None else "moeblaze.reference.route (fp32) in the forward"
    return Impl(forward, [w1, w3, w2, inp.wr], leaves, path)


def _peer(name: str, root) -> "peers.Peer":
    p = peers.load(name, root)
    if not p.ok:
        raise Unavailable(p.reason)
    return p


def _stacked_gate_up(inp: Inputs) -> torch.Tensor:
    """[E, 2n, d] with each expert's gate rows (w1) first, then its up rows (w3): the peers' layout."""
    with torch.no_grad():
        return torch.cat([inp.w1, inp.w3], 1)


def _sonicmoe(inp: Inputs, root) -> Impl:
    peer = _peer("sonicmoe", root)
    w13 = _stacked_gate_up(inp).requires_grad_()  # made once, outside the timed region
    w2, wr, x, K = inp.w2, inp.wr, inp.x, inp.shape["K"]
    if inp.fixed is None:
        def forward():
            return peer.module.sonicmoe(x, wr, w13, w2, K)
        return Impl(forward, [w13, w2, wr], [w13, w2, wr, x],
                    "own router (softmax over the top-k logits = softmax top-k renormalised)")
    from sonicmoe.enums import ActivationType  # on the path once the peer is loaded
    from sonicmoe.functional import moe_general_routing_inputs

    ids, w = inp.fixed
    T, E = ids.shape[0], inp.shape["E"]
    tokens = torch.arange(T, device="cuda", dtype=torch.int32).repeat_interleave(K)  # sorted, as it requires
    experts = ids.reshape(-1).int()

    def forward():
        y, _ = moe_general_routing_inputs(x, w.reshape(-1), tokens, experts, w13.permute(1, 2, 0), None,
                                          w2.permute(1, 2, 0), None, E, torch.cuda.current_stream().cuda_stream,
                                          ActivationType.SWIGLU, False, concat_layout=True)
        return y
    return Impl(forward, [w13, w2, wr], [w13, w2, wr, x, w], "caller routing (moe_general_routing_inputs)")


def _megablocks(inp: Inputs, root) -> Impl:
    peer = _peer("megablocks", root)
    mb = peer.module.MegaBlocks(_stacked_gate_up(inp), inp.w2.detach(), inp.shape["K"])  # its own re-laid copies
    x = inp.x
    if inp.fixed is None:
        def forward():
            ids, w = _reference_routing(inp)
            return mb(x, w.to(torch.bfloat16), ids.long())
        path = "moeblaze.reference.route (fp32) in the forward"
        extra = []
    else:
        ids64 = inp.fixed[0].long()
        w = inp.fixed[1]

        def forward():
            return mb(x, w.to(torch.bfloat16), ids64)
        path = "caller routing"
        extra = [w]
    params = list(mb.leaves) + [inp.wr]
    return Impl(forward, params, params + [x] + extra, path)


def build(impl: str, inp: Inputs, peers_root=None) -> Impl:
    """The impl on these inputs; Unavailable when a peer cannot run here."""
    if impl == "moeblaze":
        return _moeblaze(inp, "save-h")
    if impl == "moeblaze-recompute":
        return _moeblaze(inp, "recompute")
    if impl == "sonicmoe":
        return _sonicmoe(inp, peers_root)
    if impl == "megablocks":
        return _megablocks(inp, peers_root)
    if impl == "torch-grouped_mm":
        return _torch_baseline(inp, torch_grouped_mm)
    if impl == "torch-loop":
        return _torch_baseline(inp, torch_loop)
    raise ValueError(f"impl: unknown '{impl}'")
