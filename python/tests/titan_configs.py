"""Small torchtitan (0.3) MoE layers built from its own config helpers
(torchtitan/models/common/config_utils.py), as its Qwen3 and DeepSeek-V3 models build them:
a softmax router with route_norm and no shared experts (Qwen3-MoE), and a sigmoid router
with node-limited groups, a route scale, the load-balancing expert bias and a shared expert
(DeepSeek-V3). Shared by the CPU and GPU tests of moeblaze.torchtitan."""
from functools import partial

import torch
import moeblaze.torch as mbt
from moeblaze.reference import moe as ref_moe
from torchtitan.models.common.config_utils import (make_ffn_config, make_moe_config, make_routed_experts_config,
                                                   make_router_config)

ROUTERS = ["qwen3", "deepseek_v3"]


def _init(std):
    return {"weight": partial(torch.nn.init.normal_, std=std)}


def moe_config(router: str, dim: int = 128, hidden: int = 64, experts: int = 16, top_k: int = 4):
    # Weights at a scale where the experts' activations are O(1): errors are measured on
    # outputs that are not vanishingly small.
    experts_init = {"w1_EFD": partial(torch.nn.init.normal_, std=dim ** -0.5),
                    "w3_EFD": partial(torch.nn.init.normal_, std=dim ** -0.5),
                    "w2_EDF": partial(torch.nn.init.normal_, std=hidden ** -0.5)}
    routed = make_routed_experts_config(dim=dim, hidden_dim=hidden, num_experts=experts, top_k=top_k,
                                        param_init=experts_init, comm_backend="standard")
    if router == "qwen3":
        return make_moe_config(num_experts=experts, routed_experts=routed, load_balance_coeff=None,
                               router=make_router_config(dim=dim, num_experts=experts, gate_param_init=_init(0.5),
                                                         top_k=top_k, score_func="softmax", route_norm=True))
    if router == "deepseek_v3":
        shared = make_ffn_config(dim=dim, hidden_dim=hidden, w1_param_init=_init(dim ** -0.5),
                                 w2w3_param_init=_init(hidden ** -0.5))
        return make_moe_config(num_experts=experts, routed_experts=routed, shared_experts=shared,
                               load_balance_coeff=1e-3,
                               router=make_router_config(dim=dim, num_experts=experts, gate_param_init=_init(0.5),
                                                         top_k=top_k, score_func="sigmoid", route_norm=True,
                                                         route_scale=2.5, num_expert_groups=4, num_limited_groups=2))
    raise ValueError(f"unknown router {router}; known: {ROUTERS}")


def build_moe(cfg, seed: int = 0, device="cpu", dtype=torch.float32):
    """The MoE module of `cfg`, its parameters drawn by torchtitan's init_states from `seed`,
    and a non-zero expert bias where the router has one (so that it shapes the picks)."""
    torch.manual_seed(seed)
    moe = cfg.build()
    moe.init_states(buffer_device=torch.device("cpu"))
    if moe.expert_bias_E is not None:
        with torch.no_grad():
            moe.expert_bias_E.copy_(torch.randn(moe.expert_bias_E.shape, generator=torch.Generator().manual_seed(7))
                                    * 0.1)
    return moe.to(device=device, dtype=dtype)


class ReferenceKernels:
    """Stands in for moeblaze.torch.moe (patched over it): the reference layer, float32 math,
    on the arguments the adapter passes, which it records. On the CPU it replaces the kernels;
    on the GPU it is the higher-precision reference."""

    def __init__(self):
        self.calls = []

    def __call__(self, x, w1, w3, w2, *, topk_ids, topk_weights, activation, checkpoint, **kw):
        assert not kw, kw
        self.calls.append(dict(x=x, w1=w1, w3=w3, w2=w2, ids=topk_ids, weights=topk_weights, activation=activation,
                               checkpoint=checkpoint))
        y = ref_moe(x, topk_ids, topk_weights, w1, w3, w2, activation).to(x.dtype)
        counts = torch.bincount(topk_ids.flatten().long(), minlength=w1.shape[0]).int()
        return mbt.MoEOutput(y, counts, torch.empty(0))
