"""The (token, k) gather-sum of expert parallelism as one GPU kernel (Triton): each program
sums one token's K rows over a block of columns, j = 0 .. K-1 in order, in float32, and
rounds once. It produces the same bits as _dispatch.gather_sum's elementwise PyTorch form
(the first row starts the sum, as there, so a -0.0 stays -0.0), in one pass over the rows
instead of K gathers and K float32 adds over [T, d] (about 7x less memory traffic)."""
from __future__ import annotations

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # the PyTorch form is used
    triton = None


def available(rows: Tensor) -> bool:
    return (triton is not None and rows.is_cuda and rows.dim() == 2 and
            rows.dtype in (torch.bfloat16, torch.float16, torch.float32))


if triton is not None:
    @triton.jit
    def _gather_sum(rows, position, out, D: tl.constexpr, K: tl.constexpr, BLOCK: tl.constexpr):
        t = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < D
        p = tl.load(position + t * K)
        acc = tl.load(rows + p * D + cols, mask=mask).to(tl.float32)
        for j in tl.static_range(1, K):
            p = tl.load(position + t * K + j)
            acc += tl.load(rows + p * D + cols, mask=mask).to(tl.float32)
        tl.store(out + t * D + cols, acc.to(out.dtype.element_ty), mask=mask)


def gather_sum(rows: Tensor, position: Tensor, out_dtype: torch.dtype) -> Tensor:
    """rows [S, d] (contiguous, CUDA), position int64 [T, K] -> [T, d] in out_dtype."""
    T, K = position.shape
    D = rows.shape[1]
    out = torch.empty(T, D, dtype=out_dtype, device=rows.device)
    if T == 0:
        return out
    block = min(1024, triton.next_power_of_2(D))
    _gather_sum[(T, triton.cdiv(D, block))](rows.contiguous(), position.contiguous(), out, D, K, block,
                                             num_warps=4)
    return out
