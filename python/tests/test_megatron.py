"""moeblaze.megatron without a GPU: gradient-accumulation fusion under Megatron-Core's own
DistributedDataParallel (megatron-core from PyPI, one gloo rank, overlap_grad_reduce on),
with the reference implementation of moeblaze's three ops standing in for the kernels:
main_grad holds the micro-batches' summed gradients, DDP's hooks fire for every expert
weight (its bucket bookkeeping refuses one that got no gradient), the dummy wgrad is never
added, zero_out_wgrad is honoured, and without fusion the backward leaves main_grad to DDP.
Skipped without torch or megatron-core."""
import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

import moeblaze  # noqa: E402
import moeblaze.megatron as mbm  # noqa: E402

from megatron_harness import ReferenceOps, init_megatron, megatron_ddp, reference_grads  # noqa: E402

E, K, D, N, T = 8, 2, 32, 16, 24


class Experts(torch.nn.Module):
    """An expert layer as a Megatron model would hold it, with a dense layer beside it so that
    DDP's buffer holds parameters of both kinds."""

    def __init__(self, fusion: bool, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.fusion = fusion
        self.w1 = torch.nn.Parameter((torch.randn(E, N, D, generator=g) * D ** -0.5).bfloat16())
        self.w3 = torch.nn.Parameter((torch.randn(E, N, D, generator=g) * D ** -0.5).bfloat16())
        self.w2 = torch.nn.Parameter((torch.randn(E, D, N, generator=g) * N ** -0.5).bfloat16())
        self.proj = torch.nn.Linear(D, D, bias=False, dtype=torch.bfloat16)

    def forward(self, x, ids, weights):
        return self.proj(mbm.moe(x, self.w1, self.w3, self.w2, topk_ids=ids, topk_weights=weights,
                                 gradient_accumulation_fusion=self.fusion))


@pytest.fixture
def ops(monkeypatch):
    import moeblaze.torch as mbt
    fake = ReferenceOps()
    monkeypatch.setattr(mbm, "_ops", fake)
    monkeypatch.setattr(mbt, "_check_devices", lambda **tensors: None)  # CPU tensors: the fake ops take them
    return fake


@pytest.fixture(scope="module")
def megatron_cpu():
    """Megatron's DDP allocates its buffers on torch.cuda.current_device(); here that is the CPU."""
    mp = pytest.MonkeyPatch()
    mp.setattr(torch.cuda, "current_device", lambda: "cpu")
    ps = init_megatron("gloo")
    yield
    ps.destroy_model_parallel()
    torch.distributed.destroy_process_group()
    mp.undo()


def _micro_batches(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        x = torch.randn(T, D, generator=g).bfloat16()
        ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)]).int()
        w = torch.rand(T, K, generator=g).softmax(-1)
        dy = torch.randn(T, D, generator=g).bfloat16()
        out.append((x, ids, w, dy))
    return out


def _expected_main_grads(model, batches):
    """Float32 sums over the micro-batches of each expert weight's gradient (the dense layer's
    output gradient pulled back by hand: dy_moe = dy @ proj.weight)."""
    sums = {n: torch.zeros(getattr(model, n).shape) for n in ("w1", "w3", "w2")}
    for x, ids, w, dy in batches:
        dy_moe = (dy.float() @ model.proj.weight.float()).bfloat16()
        _, _, g1, g3, g2 = reference_grads(x, ids, w, model.w1, model.w3, model.w2, dy_moe)
        for n, g in (("w1", g1), ("w3", g3), ("w2", g2)):
            sums[n] += g
    return sums


def _train_step(ddp, model, batches):
    ddp.zero_grad_buffer()
    for i, (x, ids, w, dy) in enumerate(batches):
        last = i == len(batches) - 1
        if last:
            ddp(x, ids, w).backward(dy)
        else:
            with ddp.no_sync():
                ddp(x, ids, w).backward(dy)
        for n in ("w1", "w3", "w2"):
            assert getattr(model, n).grad is None, n  # DDP's hook ran and dropped what autograd held
    ddp.finish_grad_sync()  # with overlap_grad_reduce: raises unless every parameter's hook fired


@pytest.mark.parametrize("zero_out_wgrad", [False, True])
def test_fusion_adds_into_main_grad_and_ddp_hooks_fire(ops, megatron_cpu, zero_out_wgrad):
    model = Experts(fusion=True)
    ddp = megatron_ddp(model, D)
    for n in ("w1", "w3", "w2"):
        p = getattr(model, n)
        p.zero_out_wgrad = zero_out_wgrad
        # A dummy that were added would poison main_grad; zero_out_wgrad must overwrite this.
        mbm.get_dummy_wgrad(p.shape, p.dtype, p.device).fill_(math.nan)
    batches = _micro_batches(2)
    _train_step(ddp, model, batches)
    assert ops.calls.count("backward_accumulate") == 2 and "backward" not in ops.calls
    want = _expected_main_grads(model, batches)
    for n in ("w1", "w3", "w2"):
        p = getattr(model, n)
        assert p.grad_added_to_main_grad, n
        got = p.main_grad
        assert torch.isfinite(got).all(), n
        assert got.abs().max() > 0, n
        assert torch.allclose(got, want[n], rtol=1e-4, atol=1e-5), (n, (got - want[n]).abs().max())
    assert model.proj.weight.main_grad.abs().max() > 0  # the dense layer went through DDP's add


def test_without_fusion_gradients_go_through_ddp(ops, megatron_cpu):
    model = Experts(fusion=False)
    ddp = megatron_ddp(model, D)
    batches = _micro_batches(2, seed=2)
    _train_step(ddp, model, batches)
    assert ops.calls.count("backward") == 2 and "backward_accumulate" not in ops.calls
    want = _expected_main_grads(model, batches)
    for n in ("w1", "w3", "w2"):
        p = getattr(model, n)
        assert not p.grad_added_to_main_grad, n
        # bf16 gradients added into fp32 by DDP's hook: bf16 rounding per micro-batch.
        err = ((p.main_grad - want[n]).norm() / want[n].norm()).item()
        assert 0 < err < 1e-2, (n, err)


def test_ddp_zero_grad_buffer_resets_the_flag(ops, megatron_cpu):
    model = Experts(fusion=True)
    ddp = megatron_ddp(model, D)
    _train_step(ddp, model, _micro_batches(1))
    assert model.w1.grad_added_to_main_grad
    ddp.zero_grad_buffer()
    assert not model.w1.grad_added_to_main_grad and model.w1.main_grad.abs().max() == 0


def test_input_and_routing_gradients(ops):
    """x and topk_weights get their gradients as from the plain layer, with or without fusion."""
    model = Experts(fusion=True)
    for p in (model.w1, model.w3, model.w2):
        p.main_grad = torch.zeros(p.shape)
    ((x, ids, w, dy),) = _micro_batches(1, seed=3)
    x, w = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = mbm.moe(x, model.w1, model.w3, model.w2, topk_ids=ids, topk_weights=w)
    y.backward(dy)
    dx, dw, *_ = reference_grads(x, ids, w, model.w1, model.w3, model.w2, dy)
    assert torch.allclose(x.grad.float(), dx, rtol=1e-2, atol=1e-2) and x.grad.abs().max() > 0
    assert torch.allclose(w.grad, dw, rtol=1e-5, atol=1e-5) and w.grad.abs().max() > 0
    # No Megatron DDP: no grad_added_to_main_grad attribute, so no dummy (as Transformer Engine).
    assert model.w1.grad is None and model.w1.main_grad.abs().max() > 0


def test_fusion_needs_main_grad(ops):
    model = Experts(fusion=True)
    ((x, ids, w, _),) = _micro_batches(1)
    with pytest.raises(moeblaze.InvalidArgument, match="main_grad") as e:
        mbm.moe(x, model.w1, model.w3, model.w2, topk_ids=ids, topk_weights=w)
    assert e.value.argument == "w1"
    model.w1.main_grad = torch.zeros(model.w1.shape, dtype=torch.bfloat16)
    with pytest.raises(moeblaze.InvalidArgument, match="float32"):
        mbm.moe(x, model.w1, model.w3, model.w2, topk_ids=ids, topk_weights=w)
    with torch.no_grad():  # frozen experts: nothing to accumulate, no main_grad needed
        mbm.moe(x, model.w1, model.w3, model.w2, topk_ids=ids, topk_weights=w)


def test_save_h_backward_runs_once(ops):
    model = Experts(fusion=False)
    ((x, ids, w, dy),) = _micro_batches(1)
    y = mbm.moe(x, model.w1, model.w3, model.w2, topk_ids=ids, topk_weights=w.requires_grad_(),
                gradient_accumulation_fusion=False)
    y.backward(dy, retain_graph=True)
    with pytest.raises(RuntimeError, match="consumed"):
        y.backward(dy)


def test_dummy_wgrad_is_cached_and_zeroed_on_request():
    a = mbm.get_dummy_wgrad([3, 4], torch.bfloat16, "cpu")
    b = mbm.get_dummy_wgrad([3, 4], torch.bfloat16, "cpu", zero=True)
    assert a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() and not b.requires_grad
    assert b.abs().max() == 0 and a.shape == (3, 4) and a.dtype == torch.bfloat16


def test_topk_from_megatron_routing_map():
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(T, E, generator=g, requires_grad=True)
    scores = logits.softmax(-1)
    top, idx = scores.topk(K, dim=-1)
    routing_map = torch.zeros(T, E, dtype=torch.bool).scatter(1, idx, True)
    probs = torch.zeros(T, E).scatter(1, idx, top)  # Megatron's router output: dense, zero off the picks
    ids, weights = mbm.topk_from_routing_map(probs, routing_map, K)
    assert ids.dtype == torch.int32 and weights.dtype == torch.float32
    order = ids.long().sort(-1)
    assert torch.equal(order.values, idx.sort(-1).values)
    assert torch.equal(weights.gather(-1, order.indices), top.gather(-1, idx.sort(-1).indices))
    weights.sum().backward()
    assert logits.grad.abs().max() > 0
    # A token with a dropped slot: the filler expert carries weight 0.
    routing_map[0, idx[0, 1]] = False
    probs = probs.detach().clone()
    probs[0, idx[0, 1]] = 0
    ids, weights = mbm.topk_from_routing_map(probs, routing_map, K)
    assert (weights[0] == 0).sum() == 1 and int(idx[0, 0]) in ids[0].tolist()
