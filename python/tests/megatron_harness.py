"""What the Megatron tests share: the three moeblaze ops in plain PyTorch (for the CPU, where the
kernels cannot run), the float32 reference gradients, and a one-process Megatron-Core setup."""
import os
import socket

import torch

from moeblaze import _capi as C
from moeblaze.reference import moe as ref_moe

_ACTIVATION = {v: k for k, v in C.ACTIVATIONS.items()}


def reference_grads(x, ids, topk_weights, w1, w3, w2, dy, activation="swiglu"):
    """Float32 gradients of sum(y * dy) in (x, topk_weights, w1, w3, w2) (None for w3=None)."""
    inputs = [x, topk_weights, w1, w3, w2]
    leaves = [t.detach().float().requires_grad_() if t is not None else None for t in inputs]
    with torch.enable_grad():
        y = ref_moe(leaves[0], ids, leaves[1], leaves[2], leaves[3], leaves[4], activation)
        present = [t for t in leaves if t is not None]
        grads = iter(torch.autograd.grad(y, present, dy.float()))
    return [next(grads) if t is not None else None for t in leaves]


class ReferenceOps:
    """torch.ops.moeblaze.forward / backward / backward_accumulate with the same arguments and
    results, computed by moeblaze.reference in float32; the routing goes to the backward in
    `saved`, as the kernels' index arrays do. Records which ops ran."""

    def __init__(self):
        self.calls = []

    def forward(self, x, topk_ids, topk_weights, w_router, router_bias, w1, w3, w2, bias_up, bias_down, cfg,
                route_scale, mode):
        assert w_router is None and bias_up is None and bias_down is None
        self.calls.append("forward")
        y = ref_moe(x, topk_ids, topk_weights, w1, w3, w2, _ACTIVATION[cfg[4]]).to(x.dtype)
        saved = topk_ids.to(torch.int32).contiguous().view(torch.uint8).clone()
        state = torch.tensor(list(topk_ids.shape), dtype=torch.int64).view(torch.uint8)
        counts = torch.bincount(topk_ids.flatten().long(), minlength=cfg[0]).int()
        return y, saved, state, counts, torch.empty(0)

    def _grads(self, dy, x, topk_weights, w1, w3, w2, saved, state, cfg):
        T, K = state.view(torch.int64).tolist()
        ids = saved.view(torch.int32).view(T, K)
        return reference_grads(x, ids, topk_weights, w1, w3, w2, dy, _ACTIVATION[cfg[4]])

    def backward(self, dy, x, topk_weights, w_router, router_bias, w1, w3, w2, bias_up, bias_down, saved, state, cfg,
                 route_scale):
        self.calls.append("backward")
        dx, dtw, dw1, dw3, dw2 = self._grads(dy, x, topk_weights, w1, w3, w2, saved, state, cfg)
        empty = torch.empty(0, dtype=torch.bfloat16)
        cast = lambda g, like: g.to(like.dtype) if g is not None else torch.empty(0, dtype=torch.bfloat16)  # noqa: E731
        return cast(dx, x), cast(dw1, w1), cast(dw3, w3), cast(dw2, w2), dtw, empty, empty.clone(), empty.clone()

    def backward_accumulate(self, dy, x, topk_weights, w_router, router_bias, w1, w3, w2, bias_up, bias_down, saved,
                            state, cfg, route_scale, dw1, dw3, dw2, dbu, dbd):
        self.calls.append("backward_accumulate")
        dx, dtw, g1, g3, g2 = self._grads(dy, x, topk_weights, w1, w3, w2, saved, state, cfg)
        for target, g in ((dw1, g1), (dw3, g3), (dw2, g2)):
            if target is not None:
                target.add_(g.to(target.dtype))
        return dx.to(x.dtype), dtw, torch.empty(0, dtype=torch.bfloat16)


def init_megatron(backend: str):
    """A one-rank process group and Megatron's model-parallel state (all sizes 1)."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    if not dist.is_initialized():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
        dist.init_process_group(backend, rank=0, world_size=1)
    if not ps.model_parallel_is_initialized():
        ps.initialize_model_parallel()
    return ps


def megatron_ddp(module, hidden: int, overlap_grad_reduce: bool = True):
    """Megatron-Core's DistributedDataParallel around `module`: fp32 main_grad buffers, the
    per-parameter accumulation hooks, and (overlap_grad_reduce) the bucket bookkeeping that
    refuses a parameter whose hook saw no gradient."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.transformer import TransformerConfig
    config = TransformerConfig(num_layers=1, hidden_size=hidden, num_attention_heads=1)
    ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=overlap_grad_reduce)
    return DistributedDataParallel(config, ddp_config, module)
