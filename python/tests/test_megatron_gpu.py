"""moeblaze.megatron on a GPU with the kernels, under Megatron-Core's DistributedDataParallel
(one NCCL rank, overlap_grad_reduce on): two micro-batches with gradient-accumulation fusion
(added into main_grad in the epilogues, DDP's hooks fire on the dummy wgrads) and without it
(bf16 gradients added by DDP's hooks), each expert weight's main_grad against the float32
reference within bf16 tolerance and never zero; input and routing gradients likewise.
Skipped without a CUDA GPU or megatron-core."""
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

import moeblaze.megatron as mbm  # noqa: E402

from megatron_harness import init_megatron, megatron_ddp, reference_grads  # noqa: E402

DEV = "cuda"
# The torchtitan and Hugging Face GPU tests' shape (d = 128, n = 64): its kernels compile once.
E, K, D, N, T = 16, 4, 128, 64, 1024


def rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


class Experts(torch.nn.Module):
    def __init__(self, fusion: bool):
        super().__init__()
        g = torch.Generator(device=DEV).manual_seed(0)
        self.fusion = fusion
        self.w1 = torch.nn.Parameter((torch.randn(E, N, D, device=DEV, generator=g) * D ** -0.5).bfloat16())
        self.w3 = torch.nn.Parameter((torch.randn(E, N, D, device=DEV, generator=g) * D ** -0.5).bfloat16())
        self.w2 = torch.nn.Parameter((torch.randn(E, D, N, device=DEV, generator=g) * N ** -0.5).bfloat16())

    def forward(self, x, ids, weights):
        return mbm.moe(x, self.w1, self.w3, self.w2, topk_ids=ids, topk_weights=weights,
                       gradient_accumulation_fusion=self.fusion)


@pytest.fixture(scope="module")
def megatron():
    torch.cuda.set_device(0)
    ps = init_megatron("nccl")
    yield
    ps.destroy_model_parallel()
    torch.distributed.destroy_process_group()


def _micro_batches(n):
    g = torch.Generator(device=DEV).manual_seed(1)
    out = []
    for _ in range(n):
        x = torch.randn(T, D, device=DEV, generator=g).bfloat16()
        ids = torch.stack([torch.randperm(E, device=DEV, generator=g)[:K] for _ in range(T)]).int()
        w = torch.rand(T, K, device=DEV, generator=g).softmax(-1)
        dy = torch.randn(T, D, device=DEV, generator=g).bfloat16()
        out.append((x, ids, w, dy))
    return out


@pytest.mark.parametrize("fusion", [True, False])
def test_main_grad_under_megatron_ddp_matches_the_reference(megatron, fusion):
    model = Experts(fusion)
    ddp = megatron_ddp(model, D)
    batches = _micro_batches(2)
    ddp.zero_grad_buffer()
    inputs = []
    for i, (x, ids, w, dy) in enumerate(batches):
        x, w = x.clone().requires_grad_(), w.clone().requires_grad_()
        inputs.append((x, w))
        if i == len(batches) - 1:
            ddp(x, ids, w).backward(dy)
        else:
            with ddp.no_sync():
                ddp(x, ids, w).backward(dy)
    ddp.finish_grad_sync()  # raises unless every parameter's hook fired
    want = {n: torch.zeros(getattr(model, n).shape, device=DEV) for n in ("w1", "w3", "w2")}
    for (x, ids, w, dy), (xg, wg) in zip(batches, inputs):
        dx, dtw, g1, g3, g2 = reference_grads(x, ids, w, model.w1, model.w3, model.w2, dy)
        for n, g in (("w1", g1), ("w3", g3), ("w2", g2)):
            want[n] += g
        assert xg.grad.abs().max() > 0 and rel(xg.grad, dx) < 1e-2, rel(xg.grad, dx)
        assert wg.grad.abs().max() > 0 and rel(wg.grad, dtw) < 1e-2, rel(wg.grad, dtw)
    for n in ("w1", "w3", "w2"):
        p = getattr(model, n)
        assert p.grad is None and p.grad_added_to_main_grad == fusion, n
        assert p.main_grad.abs().max() > 0, n
        assert rel(p.main_grad, want[n]) < 1e-2, (n, rel(p.main_grad, want[n]))
