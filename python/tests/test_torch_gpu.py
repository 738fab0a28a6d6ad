"""moeblaze.torch on a GPU against the pure-PyTorch reference (same weights): outputs and
gradients, a short training run, CUDA-graph replay, torch.compile. Skipped without torch
or a GPU. Heavy suite shapes run with MOEBLAZE_SUITE=1."""
import os

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

import moeblaze.torch as mbt  # noqa: E402
from moeblaze.reference import ReferenceMoE, moe as ref_moe  # noqa: E402


def rel(a, b):
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm()).item()


def make_layer(E, K, d, n, router="softmax", activation="swiglu", checkpoint="save-h", renorm=True, scale=1.0):
    torch.manual_seed(0)
    return mbt.MoE(E, K, d, n, activation=activation, router=router, checkpoint=checkpoint, renormalize=renorm,
                   route_scale=scale, device="cuda")


SMALL = [
    dict(E=8, K=2, d=256, n=128, T=512),
    dict(E=64, K=8, d=256, n=128, T=1024, checkpoint="recompute"),
    dict(E=60, K=4, d=128, n=192, T=777, activation="geglu"),
    dict(E=16, K=2, d=128, n=128, T=300, activation="gelu"),
    dict(E=256, K=8, d=256, n=128, T=1024, router="sigmoid", scale=2.5),
]
SUITE = [
    dict(E=8, K=2, d=4096, n=14336, T=16384),
    dict(E=32, K=4, d=2880, n=2880, T=16384),
    dict(E=64, K=8, d=2048, n=1024, T=32768, renorm=False),
    dict(E=128, K=8, d=2048, n=768, T=32768),
    dict(E=256, K=8, d=7168, n=2048, T=16384, router="sigmoid", scale=2.5),
    dict(E=512, K=10, d=2048, n=512, T=32768),
]
CASES = SMALL + (SUITE if os.environ.get("MOEBLAZE_SUITE") else [])


@pytest.mark.parametrize("c", CASES, ids=lambda c: "E{E}K{K}d{d}n{n}".format(**c))
def test_module_matches_reference(c):
    m = make_layer(c["E"], c["K"], c["d"], c["n"], c.get("router", "softmax"), c.get("activation", "swiglu"),
                   c.get("checkpoint", "save-h"), c.get("renorm", True), c.get("scale", 1.0))
    ref = ReferenceMoE(m)
    x = torch.randn(c["T"], c["d"], device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(c["T"], c["d"], device="cuda", dtype=torch.bfloat16)
    out = m(x)
    out.y.backward(dy)
    got = {"y": out.y.detach(), "dx": x.grad.clone(), "w1": m.w1.grad.clone(), "w2": m.w2.grad.clone(),
           "gate": m.gate.weight.grad.clone()}
    if m.w3 is not None:
        got["w3"] = m.w3.grad.clone()
    for p in list(m.parameters()) + [x]:
        p.grad = None
    y_ref = ref(x)
    y_ref.backward(dy)
    want = {"y": y_ref.detach(), "dx": x.grad, "w1": m.w1.grad, "w2": m.w2.grad, "gate": m.gate.weight.grad}
    if m.w3 is not None:
        want["w3"] = m.w3.grad
    for k in want:
        assert rel(got[k], want[k]) < 1e-2, (k, rel(got[k], want[k]))
    assert int(out.expert_counts.sum()) == c["T"] * c["K"]


def test_step_memory_stays_within_the_plan():
    """Peak extra memory of a training step (weight gradients excluded) is what the layer's
    memory plan says: saved + the larger scratch + y + dx, nothing materialised by autograd."""
    from moeblaze import _capi as C
    E, K, d, n, T = 8, 2, 1024, 2048, 4096
    m = make_layer(E, K, d, n)
    x = torch.randn(T, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(T, d, device="cuda", dtype=torch.bfloat16)
    m(x).y.backward(dy)  # kernels loaded, allocator warm
    for p in list(m.parameters()) + [x]:
        p.grad = None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    m(x).y.backward(dy)
    torch.cuda.synchronize()
    weight_grads = sum(p.numel() * p.element_size() for p in m.parameters())
    peak = torch.cuda.max_memory_allocated() - base - weight_grads
    plan = C.plan_memory(mbt._config(m.cfg, m.route_scale), T, "save-h")
    expected = plan.saved_bytes + max(plan.forward_scratch_bytes, plan.backward_scratch_bytes) + 2 * T * d * 2
    assert peak <= expected + (8 << 20), (peak / 2 ** 20, expected / 2 ** 20)


def test_functional_caller_routing_gate_gradient():
    E, K, d, n, T = 16, 4, 128, 128, 500
    torch.manual_seed(1)
    w1 = (torch.randn(E, n, d, device="cuda") * d ** -0.5).bfloat16().requires_grad_()
    w3 = (torch.randn(E, n, d, device="cuda") * d ** -0.5).bfloat16().requires_grad_()
    w2 = (torch.randn(E, d, n, device="cuda") * n ** -0.5).bfloat16().requires_grad_()
    x = torch.randn(T, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    ids = torch.stack([torch.randperm(E, device="cuda")[:K] for _ in range(T)]).int()
    wts = torch.rand(T, K, device="cuda").softmax(-1).requires_grad_()
    dy = torch.randn(T, d, device="cuda", dtype=torch.bfloat16)
    out = mbt.moe(x, w1, w3, w2, topk_ids=ids, topk_weights=wts)
    out.y.backward(dy)
    g = [t.grad.clone() for t in (x, wts, w1, w3, w2)]
    for t in (x, wts, w1, w3, w2):
        t.grad = None
    ref_moe(x, ids, wts, w1, w3, w2).backward(dy.float())
    for a, b, name in zip(g, (x.grad, wts.grad, w1.grad, w3.grad, w2.grad), "x wts w1 w3 w2".split()):
        assert rel(a, b) < 1e-2, name


def test_bad_input_is_rejected_before_launch():
    m = make_layer(8, 2, 64, 64)
    with pytest.raises(ValueError) as e:
        m(torch.randn(10, 64, device="cuda"))  # float32
    assert e.value.argument == "x"
    with pytest.raises(ValueError) as e:
        m(torch.randn(10, 64, dtype=torch.bfloat16))  # CPU
    assert e.value.argument == "x"
    with pytest.raises(ValueError) as e:
        m(torch.randn(64, 10, device="cuda", dtype=torch.bfloat16).t())  # not contiguous... shape [10, 64]
    assert e.value.argument == "x"


def _tiny_model(use_moeblaze, seed=0):
    torch.manual_seed(seed)
    layers = [make_layer(16, 2, 128, 128) for _ in range(3)]

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.moes = torch.nn.ModuleList(layers)
            self.refs = [ReferenceMoE(l) for l in layers]
            self.head = torch.nn.Linear(128, 1, device="cuda", dtype=torch.bfloat16)

        def forward(self, x):
            for m, r in zip(self.moes, self.refs):
                x = x + (m(x).y if use_moeblaze else r(x))
            return self.head(x)

    return Model()


def test_training_loss_curves_agree():
    curves = []
    for use in (True, False):
        model = _tiny_model(use)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        g = torch.Generator(device="cuda").manual_seed(5)
        losses = []
        for step in range(200):
            x = torch.randn(256, 128, device="cuda", dtype=torch.bfloat16, generator=g)
            target = x[:, :1].float().sin()
            loss = torch.nn.functional.mse_loss(model(x).float(), target)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        curves.append(losses)
    a, b = torch.tensor(curves[0]), torch.tensor(curves[1])
    # Each step's loss carries bf16 rounding noise of its own (different summation orders), so
    # the curves are compared over windows of 10 steps: every window mean within 1%.
    wa, wb = a.view(-1, 10).mean(1), b.view(-1, 10).mean(1)
    assert ((wa - wb).abs() / wb.abs()).max().item() < 0.01, ((wa - wb).abs() / wb.abs())
    assert a[-20:].mean() < a[:20].mean()  # it trains


def test_second_backward_of_one_forward_is_refused():
    # save-h: the backward writes dH over the saved H, so a retained graph cannot run twice.
    m = make_layer(8, 2, 128, 128)
    x = torch.randn(64, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    y = m(x).y
    y.backward(torch.ones_like(y), retain_graph=True)
    with pytest.raises(RuntimeError, match="consumed by an earlier backward"):
        y.backward(torch.ones_like(y))


def test_cuda_graph_replay_is_identical():
    m = make_layer(32, 4, 256, 128)
    x = torch.randn(512, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(512, 256, device="cuda", dtype=torch.bfloat16)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):  # warm-up: kernels loaded, allocator settled
            m(x).y.backward(dy)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    m.zero_grad(set_to_none=False)
    with torch.cuda.graph(g):
        y = m(x).y
        y.backward(dy)
    g.replay()
    first = (y.clone(), m.w1.grad.clone())
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(first[0], y)
    eager = make_layer(32, 4, 256, 128)
    eager.load_state_dict(m.state_dict())
    assert torch.equal(eager(x).y, y)


def test_torch_compile_treats_the_layer_as_an_opaque_op():
    m = make_layer(8, 2, 128, 128)
    x = torch.randn(64, 128, device="cuda", dtype=torch.bfloat16)
    f = torch.compile(lambda t: m(t).y * 2, fullgraph=True)
    assert torch.equal(f(x), m(x).y * 2)
