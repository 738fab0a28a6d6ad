"""moeblaze as torchtitan's routed experts (torchtitan 0.3, torchtitan/models/common/moe.py).

    # on the command line, like torchtitan's own overrides:
    --override.imports moeblaze.torchtitan.moeblaze_routed_experts
    # or on a model that is already built (before parallelize / torch.compile):
    import moeblaze.torchtitan; moeblaze.torchtitan.apply(model)

Where it hooks, and why. torchtitan's `MoE.forward` runs its router
(`TokenChoiceTopKRouter`: softmax or sigmoid scores, node-limited groups, the load-balancing
`expert_bias_E`, `route_norm`, `route_scale`), counts tokens per expert for the bias update,
then calls `RoutedExperts(x, topk_scores, topk_expert_ids, counts)`, which permutes the tokens
by expert (`token_dispatcher.dispatch`), runs `GroupedExperts` (`inner_experts`: grouped GEMMs
on the permuted rows), and scores and scatter-adds them back (`combine`); then it adds the
shared experts. moeblaze's layer takes exactly what `RoutedExperts` receives: the unpermuted
tokens and the router's top-k ids and scores, and it never materialises the permuted copy
(its GEMMs gather rows in their loads; its combine sums each token's K rows in order). So
`RoutedExperts` is replaced by `MoeblazeRoutedExperts`, one moeblaze call in place of
dispatch + experts + combine, and everything around it stays torchtitan's: the router and its
gradient (the score gradient flows back through `topk_scores`), the token counts and expert
bias, the shared experts. Hooking `GroupedExperts` instead would keep torchtitan's permute
and scatter-add around a layer that does both itself.

The weights stay where they were: `MoeblazeRoutedExperts` keeps `inner_experts`, the stock
`GroupedExperts` with `w1_EFD`/`w3_EFD` [E, F, D] and `w2_EDF` [E, D, F] (moeblaze's own
w1/w3/w2 layout, read in place), so parameter names, `param_init`, sharding configs and
checkpoints are unchanged. As in `GroupedExperts`, weights and tokens run in bf16 (fp32
parameters are cast per call, their gradients flow back through the cast; bf16 ones, e.g.
under FSDP2's bf16 mixed precision, are read in place) and the output has the input's dtype.

Not covered, and refused with a message rather than computed differently: expert parallelism
(a token dispatcher with an EP mesh of more than one rank: its all-to-all is the
dispatcher's), and experts other than the stock SwiGLU `GroupedExperts` (GPT-OSS's biased,
clamped experts; the fused-w13 or quantized variants).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List

import torch
from torch import Tensor
from torchtitan.config import derive, override
from torchtitan.models.common.moe import GroupedExperts, RoutedExperts

from . import _capi as C
from . import torch as mbt

__all__ = ["MoeblazeRoutedExperts", "UnsupportedExperts", "apply", "moeblaze_routed_experts"]


class UnsupportedExperts(ValueError):
    """The routed experts have math, a layout or a parallelism moeblaze does not run."""


def _local(t: Tensor) -> Tensor:
    # As GroupedExperts.forward: under a parallelized RoutedExperts (local_map) the expert
    # weights are DTensors whose local shard is what the experts compute with.
    return t.to_local() if type(t).__name__ == "DTensor" else t


def _check_supported(module: RoutedExperts) -> None:
    inner = module.inner_experts
    name = type(inner).__name__
    stock = (type(inner).forward is GroupedExperts.forward and
             type(inner)._grouped_mm is GroupedExperts._grouped_mm)
    if not stock or not all(hasattr(inner, w) for w in ("w1_EFD", "w2_EDF", "w3_EFD")):
        raise UnsupportedExperts(f"{name}: moeblaze runs torchtitan's stock GroupedExperts (SwiGLU on w1_EFD, "
                                 "w3_EFD, w2_EDF); this class computes something else (its own forward or "
                                 "_grouped_mm)")
    mesh = getattr(module.token_dispatcher, "ep_mesh", None)
    if mesh is not None and mesh.size() > 1:
        raise UnsupportedExperts(f"{type(module.token_dispatcher).__name__}: expert parallelism (an EP mesh of "
                                 f"{mesh.size()} ranks) is not supported by moeblaze.torchtitan")


class MoeblazeRoutedExperts(RoutedExperts):
    """torchtitan's RoutedExperts with dispatch, grouped experts and combine as one moeblaze
    call on the router's outputs. Same children (inner_experts, token_dispatcher), same
    parameters; `checkpoint` is moeblaze's checkpoint mode ("save-h" or "recompute")."""

    @dataclass(kw_only=True, slots=True)
    class Config(RoutedExperts.Config):
        checkpoint: str = "save-h"

    def __init__(self, config: Config):
        super().__init__(config)
        self.checkpoint = _checked_mode(config.checkpoint)

    @classmethod
    def adopt(cls, module: RoutedExperts, checkpoint: str = "save-h") -> "MoeblazeRoutedExperts":
        """A MoeblazeRoutedExperts holding `module`'s own children, parameters and hooks (no
        copy: the optimizer's references stay valid)."""
        new = cls.__new__(cls)
        new.__dict__.update(module.__dict__)
        new.checkpoint = _checked_mode(checkpoint)
        return new

    def forward(self, x_BLD: Tensor, topk_scores_BLK: Tensor, topk_expert_ids_BLK: Tensor,
                num_local_tokens_per_expert_E: Tensor) -> Tensor:
        # The counts are the MoE's (for its expert-bias update); moeblaze counts its own.
        del num_local_tokens_per_expert_E
        _check_supported(self)
        B, L, D = x_BLD.shape
        K = topk_scores_BLK.shape[-1]
        inner = self.inner_experts
        w1, w3, w2 = (_local(inner.w1_EFD).bfloat16(), _local(inner.w3_EFD).bfloat16(),
                      _local(inner.w2_EDF).bfloat16())
        x = x_BLD.reshape(B * L, D).bfloat16().contiguous()
        ids = topk_expert_ids_BLK.reshape(B * L, K).to(torch.int32).contiguous()
        scores = topk_scores_BLK.reshape(B * L, K).float().contiguous()  # differentiable: the router trains
        out = mbt.moe(x, w1.contiguous(), w3.contiguous(), w2.contiguous(), topk_ids=ids, topk_weights=scores,
                      activation="swiglu", checkpoint=self.checkpoint)
        return out.y.to(x_BLD.dtype).view(B, L, D)


def _checked_mode(mode: str) -> str:
    if mode not in C.MODES:
        raise C.InvalidArgument("checkpoint", f"checkpoint: '{mode}' is not one of save-h, recompute")
    return mode


@override(target=RoutedExperts.Config,
          description="moeblaze: dispatch, SwiGLU grouped experts and combine in one fused layer")
def moeblaze_routed_experts(cfg: RoutedExperts.Config, *, checkpoint: str = "save-h") -> RoutedExperts.Config:
    """torchtitan override (`--override.imports moeblaze.torchtitan.moeblaze_routed_experts`,
    or `'moeblaze.torchtitan.moeblaze_routed_experts={"checkpoint": "recompute"}'`): every
    RoutedExperts config becomes a MoeblazeRoutedExperts config with the same fields."""
    if isinstance(cfg, MoeblazeRoutedExperts.Config):
        return cfg
    if type(cfg.inner_experts) is not GroupedExperts.Config:
        raise UnsupportedExperts(f"{type(cfg.inner_experts).__qualname__}: moeblaze runs torchtitan's stock "
                                 "GroupedExperts (SwiGLU on w1_EFD, w3_EFD, w2_EDF) only")
    return derive(cfg, MoeblazeRoutedExperts.Config, checkpoint=_checked_mode(checkpoint))


def apply(model: torch.nn.Module, checkpoint: str = "save-h") -> List[str]:
    """Replaces every RoutedExperts of a built model by a MoeblazeRoutedExperts that keeps its
    children and parameters; returns the replaced modules' names. Call it before
    parallelizing or compiling the model, as torchtitan's own model converters are."""
    _checked_mode(checkpoint)
    replaced = []
    for name, module in list(model.named_modules()):
        if not isinstance(module, RoutedExperts) or isinstance(module, MoeblazeRoutedExperts):
            continue
        _check_supported(module)
        new = MoeblazeRoutedExperts.adopt(module, checkpoint)
        if name:
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, new)
        else:
            raise C.InvalidArgument("model", "model: is itself a RoutedExperts; use MoeblazeRoutedExperts.adopt")
        replaced.append(name)
    if not replaced:
        raise C.InvalidArgument("model", "model: has no torchtitan RoutedExperts module to replace")
    return replaced
