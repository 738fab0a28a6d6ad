"""moeblaze as a Hugging Face transformers experts backend.

    import moeblaze.hf                      # registers "moeblaze" in transformers' ExpertsInterface
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, experts_implementation="moeblaze")

Only the experts' forward is replaced (transformers' `@use_experts_implementation` dispatch):
the model's router, its routing (softmax, DeepSeek-V3's group-limited sigmoid with a correction
bias and a scale), its shared experts and its auxiliary losses stay the model's own. The
experts run moeblaze's kernels on the router's picks (caller routing); the gate gradient flows
back into the router.

Weight layouts, read as the model holds them:
- gate_up_proj [E, 2n, d] ([gate; up] rows per expert) and down_proj [E, d, n]: Mixtral,
  Qwen3-MoE, OLMoE, DeepSeek-V3, Qwen3-Next, ... The kernels read the fused gate_up in place
  and write its gradient in the same layout: no copies.
- up_proj [E, n, d] without a gate (has_gate=False): a plain activation on W1.
- GPT-OSS (gate_up_proj [E, d, 2n] with gate and up columns interleaved, down_proj [E, n, d],
  biases, its clamped SwiGLU): see `_gpt_oss_weights`.
Anything else raises UnsupportedExperts naming the module and what it cannot run; nothing
falls back silently.

Routing ids are checked: an id outside [0, E) raises InvalidArgument('topk_ids') (so does
expert-parallel routing that marks other ranks' experts with such ids: not supported here). The router's int64 ids are range-checked before they are
narrowed to int32, so 2**32 + 3 is an error, not expert 3. The check is a host sync per
experts call (one 4-byte read after the index build); set_check_routing(False) skips it and
leaves bad ids out (no output, no gradient). A CUDA graph capture skips it on its own.
"""
from __future__ import annotations

import warnings
from typing import NamedTuple, Optional, Tuple

import torch
from torch import Tensor
from transformers.integrations.moe import ExpertsInterface, _default_apply_gate

from . import _capi as C
from . import torch as mbt
from ._routing import narrow_expert_ids

NAME = "moeblaze"

# Hugging Face activation names (config.hidden_act) -> moeblaze's, gated and plain. moeblaze's
# GELU is the tanh approximation, which is what these names mean in transformers.
_GATED = {"silu": "swiglu", "swish": "swiglu", "gelu_pytorch_tanh": "geglu", "gelu_new": "geglu"}
_PLAIN = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu", "gelu_new": "gelu", "relu": "relu"}

_checkpoint = "save-h"
_check_routing = True


class UnsupportedExperts(ValueError):
    """The experts module has math or a layout moeblaze does not run; the message says what."""


def set_checkpoint(mode: str) -> None:
    """Checkpoint mode of every moeblaze experts call: "save-h" (keep H = [A|B] between forward
    and backward, the default) or "recompute" (keep only the index arrays)."""
    global _checkpoint
    if mode not in C.MODES:
        raise C.InvalidArgument("checkpoint", f"checkpoint: '{mode}' is not one of save-h, recompute")
    _checkpoint = mode


def set_check_routing(enabled: bool) -> None:
    """Whether every moeblaze experts call raises InvalidArgument('topk_ids') for router ids
    outside [0, E) (default True: a host sync per call). False leaves such picks out."""
    global _check_routing
    _check_routing = bool(enabled)


class ExpertsSpec(NamedTuple):  # a NamedTuple: torch.compile traces its construction
    """How an experts module maps onto moeblaze: its layout and activation."""
    layout: str       # "gate_up" (fused [E,2n,d], read in place), "up" (plain [E,n,d]), "gpt_oss"
    activation: str   # moeblaze activation name
    experts: int
    hidden: int       # d
    ffn: int          # n


def _hidden_act(module) -> Optional[str]:
    cfg = getattr(module, "config", None)
    act = getattr(cfg, "hidden_act", None)
    return act.lower() if isinstance(act, str) else None


def _has_custom_gate(module) -> bool:
    """Whether the class defines its own `_apply_gate` (math other than act(gate) * up)."""
    return getattr(type(module), "_apply_gate", _default_apply_gate) is not _default_apply_gate


def experts_spec(module) -> ExpertsSpec:
    """The moeblaze view of a transformers experts module; raises UnsupportedExperts naming the
    module and the reason when its math or layout is not one moeblaze runs."""
    name = type(module).__name__
    has_gate = getattr(module, "has_gate", True)
    has_bias = getattr(module, "has_bias", False)
    transposed = getattr(module, "is_transposed", False)
    concatenated = getattr(module, "is_concatenated", True)
    E = getattr(module, "num_experts", None)
    if not isinstance(E, int):
        raise UnsupportedExperts(f"{name}: has no integer num_experts")
    if name == "GptOssExperts" or (has_gate and transposed and not concatenated and has_bias):
        return _gpt_oss_spec(module)
    if transposed:
        raise UnsupportedExperts(f"{name}: transposed expert weights ([E, d, n]) are only supported in GPT-OSS's "
                                 "layout; use experts_implementation='grouped_mm' for this model")
    if has_bias:
        raise UnsupportedExperts(f"{name}: expert biases are only supported in GPT-OSS's experts")
    act = _hidden_act(module)
    if has_gate:
        if not concatenated:
            raise UnsupportedExperts(f"{name}: interleaved gate/up rows are only supported in GPT-OSS's layout")
        if _has_custom_gate(module):
            raise UnsupportedExperts(f"{name}: defines its own _apply_gate (gating math other than act(gate) * up)")
        if act not in _GATED:
            raise UnsupportedExperts(f"{name}: gated activation '{act}' is not one moeblaze runs (it runs "
                                     f"{sorted(_GATED)}; GELU as the tanh approximation only)")
        w, down = module.gate_up_proj, module.down_proj
        if w.dim() != 3 or down.dim() != 3 or w.shape[1] != 2 * down.shape[2] or w.shape[2] != down.shape[1]:
            raise UnsupportedExperts(f"{name}: gate_up_proj {list(w.shape)} and down_proj {list(down.shape)} are not "
                                     "[E, 2n, d] and [E, d, n]")
        return ExpertsSpec("gate_up", _GATED[act], E, int(down.shape[1]), int(down.shape[2]))
    if act not in _PLAIN:
        raise UnsupportedExperts(f"{name}: activation '{act}' is not one moeblaze runs ({sorted(_PLAIN)})")
    w, down = module.up_proj, module.down_proj
    if w.dim() != 3 or down.dim() != 3 or w.shape[1] != down.shape[2] or w.shape[2] != down.shape[1]:
        raise UnsupportedExperts(f"{name}: up_proj {list(w.shape)} and down_proj {list(down.shape)} are not "
                                 "[E, n, d] and [E, d, n]")
    return ExpertsSpec("up", _PLAIN[act], E, int(down.shape[1]), int(down.shape[2]))


def _gpt_oss_spec(module) -> ExpertsSpec:
    name = type(module).__name__
    alpha, limit = getattr(module, "alpha", None), getattr(module, "limit", None)
    if (alpha, limit) != (1.702, 7.0):
        raise UnsupportedExperts(f"{name}: clamped SwiGLU with alpha={alpha}, limit={limit}; moeblaze compiles in "
                                 "GPT-OSS's alpha=1.702, limit=7")
    w, down = module.gate_up_proj, module.down_proj
    E, d, n2 = w.shape
    if tuple(down.shape) != (E, n2 // 2, d) or n2 % 2:
        raise UnsupportedExperts(f"{name}: gate_up_proj {list(w.shape)} and down_proj {list(down.shape)} are not "
                                 "[E, d, 2n] and [E, n, d]")
    if "clamped_swiglu" not in C.ACTIVATIONS:
        raise UnsupportedExperts(f"{name}: GPT-OSS's experts (biases, clamped SwiGLU) are not in this build of "
                                 "moeblaze; use experts_implementation='grouped_mm' for GPT-OSS")
    return ExpertsSpec("gpt_oss", "clamped_swiglu", E, int(d), int(n2 // 2))


_warned: set = set()


def _warn_once(key: str, message: str) -> None:
    if key in _warned or torch.compiler.is_compiling():
        return
    _warned.add(key)
    warnings.warn(message, stacklevel=3)


def _gpt_oss_weights(module, spec: ExpertsSpec):
    """GPT-OSS's experts in moeblaze's layout. Its gate_up_proj [E, d, 2n] holds gate and up in
    alternating columns (gate = [..., ::2]) and is transposed, as is down_proj [E, n, d]; the
    kernels read K-major [E, 2n, d] / [E, d, n] tiles, so these are copied each call (by
    differentiable torch ops: the gradients flow back into the model's parameters), with a
    one-time warning. The biases are small and are reordered the same way."""
    E, d, n = spec.experts, spec.hidden, spec.ffn
    _warn_once("gpt_oss_copy", f"moeblaze: {type(module).__name__} stores gate_up_proj as [E, d, 2n] with gate/up "
                               f"columns interleaved and down_proj as [E, n, d]; moeblaze copies them into "
                               f"[E, 2n, d] and [E, d, n] on every forward ({2 * 3 * E * n * d / 2**20:.0f} MiB a "
                               f"layer in bf16), and their gradients back")
    gu, down = _local(module.gate_up_proj), _local(module.down_proj)
    bu, bd = _local(module.gate_up_proj_bias), _local(module.down_proj_bias)
    w13 = gu.view(E, d, n, 2).permute(0, 3, 2, 1).reshape(E, 2 * n, d).contiguous()
    w2 = down.transpose(1, 2).contiguous()
    b13 = bu.view(E, n, 2).transpose(1, 2).reshape(E, 2 * n).contiguous()
    return w13, w2, b13, bd.contiguous()


def _check_inputs(module, spec: ExpertsSpec, hidden_states: Tensor, top_k_index: Tensor,
                  top_k_weights: Tensor, weights: Tuple[Tensor, ...]) -> None:
    name = type(module).__name__
    if hidden_states.dim() != 2 or hidden_states.shape[1] != spec.hidden:
        raise C.InvalidArgument("hidden_states", f"hidden_states: must be [tokens, {spec.hidden}], got "
                                                 f"{list(hidden_states.shape)}")
    if hidden_states.dtype != torch.bfloat16:
        raise C.InvalidArgument("hidden_states", f"hidden_states: has dtype {hidden_states.dtype}; moeblaze runs "
                                                 "bf16 (load the model with dtype=torch.bfloat16)")
    for w in weights:
        if w.dtype != torch.bfloat16:
            raise C.InvalidArgument("weights", f"{name}: expert weights have dtype {w.dtype}; moeblaze runs bf16 "
                                               "(load the model with dtype=torch.bfloat16)")
    if top_k_index.dim() != 2 or top_k_index.shape[0] != hidden_states.shape[0]:
        raise C.InvalidArgument("top_k_index", f"top_k_index: must be [tokens, top_k], got {list(top_k_index.shape)}")
    if top_k_weights.shape != top_k_index.shape:
        raise C.InvalidArgument("top_k_weights", f"top_k_weights: has shape {list(top_k_weights.shape)}, expected "
                                                 f"{list(top_k_index.shape)} like top_k_index")
    if top_k_index.dtype.is_floating_point or top_k_index.dtype == torch.bool:
        raise C.InvalidArgument("top_k_index", f"top_k_index: has dtype {top_k_index.dtype}, expected an integer type")
    if hidden_states.device.type != "cuda":
        raise C.InvalidArgument("hidden_states", f"hidden_states: is on {hidden_states.device.type}; "
                                                 "moeblaze runs on CUDA GPUs (sm_90)")


def _local(t: Tensor) -> Tensor:
    """A DTensor parameter (FSDP2 outside its forward's all-gather, or tensor parallel) cannot be
    read as one [E, ...] tensor: say so instead of computing on a shard."""
    if type(t).__name__ == "DTensor":
        raise UnsupportedExperts("moeblaze: an expert weight is a DTensor here (sharded); wrap the model with "
                                 "FSDP2's fully_shard so that forward sees the all-gathered weights, or run "
                                 "without tensor/expert parallelism")
    return t


def experts_forward(self, hidden_states: Tensor, top_k_index: Tensor, top_k_weights: Tensor) -> Tensor:
    """The experts forward transformers calls with experts_implementation="moeblaze": the
    module's weights, the model's router output (ids [T, K], weights [T, K])."""
    spec = experts_spec(self)
    if spec.layout == "gate_up":
        w1, w3, w2 = _local(self.gate_up_proj), None, _local(self.down_proj)
        weights, biases = (w1, w2), None
    elif spec.layout == "up":
        w1, w3, w2 = _local(self.up_proj), None, _local(self.down_proj)
        weights, biases = (w1, w2), None
    else:
        w1, w2, b13, b2 = _gpt_oss_weights(self, spec)
        w3 = None
        weights, biases = (w1, w2, b13, b2), (b13, b2)
    _check_inputs(self, spec, hidden_states, top_k_index, top_k_weights, weights)
    for name, w in (("w1", w1), ("w2", w2)):
        if not w.is_contiguous():
            _warn_once("contiguous_" + name, f"moeblaze: {type(self).__name__}'s {name} is not contiguous; it is "
                                             "copied on every forward")
    x = hidden_states.contiguous()
    ids = narrow_expert_ids(top_k_index, spec.experts).contiguous()
    gates = top_k_weights.to(torch.float32).contiguous()  # differentiable: the router trains
    kwargs = dict(topk_ids=ids, topk_weights=gates, activation=spec.activation, checkpoint=_checkpoint,
                  check_routing=_check_routing)
    if biases is not None:
        kwargs.update(bias_up=biases[0], bias_down=biases[1])
    out = mbt.moe(x, w1.contiguous(), w3, w2.contiguous(), **kwargs)
    return out.y.to(hidden_states.dtype)


def register(name: str = NAME) -> None:
    """Registers the backend under `name` in transformers' ExpertsInterface (done on import)."""
    ExpertsInterface.register(name, experts_forward)


register()
