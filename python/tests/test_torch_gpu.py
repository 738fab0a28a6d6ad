"""moeblaze.torch on a GPU against the pure-PyTorch reference (same weights): outputs and
gradients, a short training run, CUDA-graph replay, torch.compile. Skipped without torch
or a GPU. Heavy suite shapes run with MOEBLAZE_SUITE=1."""
import os
import sys

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

import moeblaze.torch as mbt  # noqa: E402
from moeblaze.reference import ReferenceMoE, moe as ref_moe  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # loss_curves


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


def test_training_loss_curves_agree():
    """moeblaze trains like the float32 reference, as closely as correct implementations of the
    layer agree with each other on the same run (loss_curves.py: the model, and the table).

    A single run cannot be held to a fixed bound: it is chaotic. AdamW's first updates turn a
    gradient's rounding into a whole update (m / sqrt(v) is its sign) on bf16 weights, and a
    near-tie in the router sends a token elsewhere. On this model (CPU runs of loss_curves.py)
    float32 and float64 arithmetic of the same reference, whose first losses agree to 1e-6,
    differ by 0.1% after one update and by ~1% a step from step 10 on; their 10-step window
    means by up to 0.51%, and the reference with moeblaze's bf16 rounding points ("emulated")
    by up to 0.78% from float32 and 1.04% from float64 (another set of weights: 0.87%, 1.38%).
    The old bound, every window within 1%, sat inside that spread. So the floor is measured
    here, on the same weights and data: the window differences among eager32, eager64 and
    emulated; moeblaze against eager32 may exceed their largest by half and a quarter percent
    (max) and by half and a tenth of a percent (mean), and it must train. On the CPU runs that
    bound (1.82%) caught a router without gradient (1.89%) and a down_proj gradient given to
    the next expert (27%)."""
    from loss_curves import report, train, window_differences
    curves = {impl: train(impl) for impl in ("moeblaze", "eager32", "eager64", "emulated")}
    print(report(curves))  # pytest -s shows the table: drift would be moeblaze vs emulated above the floor
    got = window_differences(curves["moeblaze"], curves["eager32"])
    floor = [window_differences(curves[a], curves[b])
             for a, b in (("eager64", "eager32"), ("emulated", "eager32"), ("emulated", "eager64"))]
    floor_max, floor_mean = max(f.max().item() for f in floor), max(f.mean().item() for f in floor)
    detail = (f"moeblaze vs eager32: max {got.max():.4f} mean {got.mean():.4f}; "
              f"floor: max {floor_max:.4f} mean {floor_mean:.4f}; {got.tolist()}")
    assert got.max().item() <= 1.5 * floor_max + 0.0025, detail
    assert got.mean().item() <= 1.5 * floor_mean + 0.001, detail
    a = torch.tensor(curves["moeblaze"])
    assert a[-20:].mean() < 0.5 * a[:20].mean(), detail  # it trains (the CPU runs: 1.3 to 0.25)


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
