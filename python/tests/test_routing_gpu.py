"""Caller-routing ids outside [0, E) on a GPU, through moeblaze.torch.moe.

- check_routing=False: each bad pick is left out. y, dx, d_topk_weights and every weight
  gradient match moeblaze.reference.moe, which sums a token's picks by expert masks and so
  computes the layer without the bad pick (no expert matches it); the rows of the tokens with
  a bad pick are compared on their own, the bad picks' d_topk_weights must be exactly 0, and
  every output starts as NaN (torch's allocations inside the layer are poisoned), as does the
  bad pick's gate (it must never be read). The four bad values give the same bits.
- check_routing=True (the default): InvalidArgument('topk_ids'), and the layer still works.
- A CUDA-graph capture skips the check (a host sync there is illegal) and leaves the picks out;
  torch.compile(fullgraph=True) keeps the check.
- moeblaze.hf range-checks int64 ids before narrowing them (2**32 + 3 is not expert 3).
Skipped without a GPU."""
import contextlib

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

import moeblaze.torch as mbt  # noqa: E402
from moeblaze import InvalidArgument  # noqa: E402
from moeblaze.reference import moe as ref_moe  # noqa: E402

E, K, d, n, T = 16, 4, 256, 128, 300
BAD_VALUES = [E, E + 5, -1, 2**31 - 1]
BAD_SLOTS = [(3, 2), (T - 10, 0)]  # (token, pick): one bad pick on each of two tokens


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


def inputs(seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, device="cuda") * scale).bfloat16()
    w1, w3, w2 = randn(E, n, d, scale=d ** -0.5), randn(E, n, d, scale=d ** -0.5), randn(E, d, n, scale=n ** -0.5)
    x, dy = randn(T, d), randn(T, d)
    ids = torch.argsort(torch.rand(T, E, generator=g, device="cuda"), dim=1)[:, :K].int()
    ids[3, 0] = 0  # token 3 also picks expert 0, before its bad pick (expert 0's first slot is position 0)
    ids[3, 1:] = torch.tensor([5, 9, 12], device="cuda", dtype=torch.int32)
    wts = torch.rand(T, K, generator=g, device="cuda") + 0.1
    return x, dy, ids, wts, (w1, w3, w2)


@contextlib.contextmanager
def poisoned_allocations():
    """Every CUDA tensor torch.empty / torch.empty_like returns meanwhile is filled with 0xff
    bytes (NaN in bf16 and f32, -1 in int32): the layer's outputs, saved state and scratch."""
    real_empty, real_like = torch.empty, torch.empty_like

    def poison(t):
        if t.is_cuda and t.numel() and t.is_contiguous():
            t.view(-1).view(torch.uint8).fill_(0xFF)
        return t

    torch.empty = lambda *a, **k: poison(real_empty(*a, **k))
    torch.empty_like = lambda *a, **k: poison(real_like(*a, **k))
    try:
        yield
    finally:
        torch.empty, torch.empty_like = real_empty, real_like


def run_moeblaze(x, dy, ids, wts, w, **kw):
    leaves = [t.detach().clone().requires_grad_() for t in (x, wts, *w)]
    with poisoned_allocations():
        out = mbt.moe(leaves[0], *leaves[2:], topk_ids=ids, topk_weights=leaves[1], **kw)
        out.y.backward(dy)
    torch.cuda.synchronize()
    return dict(y=out.y.detach(), dx=leaves[0].grad, dgates=leaves[1].grad, dw1=leaves[2].grad, dw3=leaves[3].grad,
                dw2=leaves[4].grad)


def run_reference(x, dy, ids, wts, w):
    leaves = [t.detach().clone().requires_grad_() for t in (x, wts, *w)]
    y = ref_moe(leaves[0], ids, leaves[1], *leaves[2:])
    y.backward(dy.float())
    return dict(y=y.detach(), dx=leaves[0].grad, dgates=leaves[1].grad, dw1=leaves[2].grad, dw3=leaves[3].grad,
                dw2=leaves[4].grad)


def with_bad(ids, wts, value, gate=float("nan")):
    ids, wts = ids.clone(), wts.clone()
    for t, j in BAD_SLOTS:
        ids[t, j] = value
        wts[t, j] = gate
    return ids, wts


@pytest.fixture(scope="module")
def data():
    return inputs()


def test_bad_picks_are_left_out_with_the_check_off(data):
    x, dy, ids, wts, w = data
    first = None
    for value in BAD_VALUES:
        bad_ids, bad_wts = with_bad(ids, wts, value)
        got = run_moeblaze(x, dy, bad_ids, bad_wts, w, check_routing=False)
        for k, v in got.items():
            assert not v.isnan().any(), (value, k, "an element was not written")
        for t, j in BAD_SLOTS:
            assert got["dgates"][t, j].item() == 0.0, (value, "the left-out pick's gate gradient", t, j)
        # The reference never matches a bad id to an expert: the layer without that pick. Its
        # gates there are finite (they are never read either way).
        ref_ids, ref_wts = with_bad(ids, wts, value, gate=0.5)
        want = run_reference(x, dy, ref_ids, ref_wts, w)
        for k in got:
            assert rel(got[k], want[k]) < 1e-2, (value, k, rel(got[k], want[k]))
        for t, _ in BAD_SLOTS:
            for k in ("y", "dx", "dgates"):
                assert rel(got[k][t], want[k][t]) < 1e-2, (value, k, "token", t, rel(got[k][t], want[k][t]))
        for e in range(E):
            for k in ("dw1", "dw3", "dw2"):
                assert rel(got[k][e], want[k][e]) < 1e-2, (value, k, "expert", e)
        # A slot that does not exist computes nothing: every bad value gives the same bits.
        if first is None:
            first = got
        else:
            for k in got:
                assert torch.equal(got[k], first[k]), (value, k, "differs from", BAD_VALUES[0])


def test_the_pick_left_out_equals_the_pick_with_gate_zero(data):
    """The same kernels with the pick valid and its gate 0 give the same y, dx and weight
    gradients within their rounding (the expert's slots move by one, so the weight-gradient
    reductions group differently); only its gate gradient differs (<dy, o> there, 0 here)."""
    x, dy, ids, wts, w = data
    left_out = run_moeblaze(x, dy, *with_bad(ids, wts, -1), w, check_routing=False)
    zero_ids, zero_wts = ids.clone(), wts.clone()
    for t, j in BAD_SLOTS:
        zero_wts[t, j] = 0.0
    gate_zero = run_moeblaze(x, dy, zero_ids, zero_wts, w)
    for k in ("y", "dx", "dw1", "dw3", "dw2"):
        assert rel(left_out[k], gate_zero[k]) < 2e-3, (k, rel(left_out[k], gate_zero[k]))
    mask = torch.ones(T, K, dtype=torch.bool, device="cuda")
    for t, j in BAD_SLOTS:
        mask[t, j] = False
    assert rel(left_out["dgates"][mask], gate_zero["dgates"][mask]) < 2e-3


@pytest.mark.parametrize("value", BAD_VALUES)
def test_the_check_raises_naming_topk_ids(data, value):
    x, dy, ids, wts, w = data
    bad_ids, _ = with_bad(ids, wts, value)
    with pytest.raises(InvalidArgument) as e:
        mbt.moe(x, *w, topk_ids=bad_ids, topk_weights=wts)
    assert e.value.argument == "topk_ids" and f"[0, {E})" in str(e.value) and "check_routing=False" in str(e.value)
    m = mbt.MoE(E, K, d, n, router=None, device="cuda")
    with pytest.raises(InvalidArgument) as e:
        m(x, bad_ids, wts)
    assert e.value.argument == "topk_ids"
    # The layer is healthy afterwards: a valid call matches the reference.
    got = run_moeblaze(x, dy, ids, wts, w)
    want = run_reference(x, dy, ids, wts, w)
    for k in got:
        assert rel(got[k], want[k]) < 1e-2, k


def test_a_repeated_expert_raises(data):
    x, dy, ids, wts, w = data
    twice = ids.clone()
    twice[7, 1] = twice[7, 0]
    with pytest.raises(InvalidArgument, match="twice") as e:
        mbt.moe(x, *w, topk_ids=twice, topk_weights=wts)
    assert e.value.argument == "topk_ids"


def test_cuda_graph_capture_skips_the_check_and_leaves_the_picks_out(data):
    x, dy, ids, wts, w = data
    bad_ids, bad_wts = with_bad(ids, wts, E + 5)
    eager = mbt.moe(x, *w, topk_ids=bad_ids, topk_weights=bad_wts, check_routing=False).y
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):  # warm-up outside the capture, with the check off (it would raise)
            mbt.moe(x, *w, topk_ids=bad_ids, topk_weights=bad_wts, check_routing=False)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = mbt.moe(x, *w, topk_ids=bad_ids, topk_weights=bad_wts).y  # check_routing=True: skipped in capture
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, eager)


def test_torch_compile_keeps_the_check(data):
    x, dy, ids, wts, w = data
    f = torch.compile(lambda xx, ii, ww: mbt.moe(xx, *w, topk_ids=ii, topk_weights=ww).y * 2, fullgraph=True)
    assert torch.equal(f(x, ids, wts), mbt.moe(x, *w, topk_ids=ids, topk_weights=wts).y * 2)
    bad_ids, _ = with_bad(ids, wts, -1)
    with pytest.raises(InvalidArgument):
        f(x, bad_ids, wts)


def test_hf_range_checks_int64_ids_before_narrowing(data):
    pytest.importorskip("transformers")
    import moeblaze.hf as mhf
    x, dy, ids, wts, w = data
    wide = ids.long()
    wide[3, 2] = 2**32 + 3  # int32 would wrap it to expert 3
    gate_up = torch.cat([w[0], w[1]], dim=1).contiguous()  # [E, 2n, d]

    class Experts(torch.nn.Module):  # the attributes experts_spec reads
        num_experts, has_gate, is_transposed, is_concatenated, has_bias = E, True, False, True, False

        def __init__(self):
            super().__init__()
            self.config = type("Config", (), {"hidden_act": "silu"})()
            self.gate_up_proj = torch.nn.Parameter(gate_up)
            self.down_proj = torch.nn.Parameter(w[2])

    m = Experts()
    with pytest.raises(InvalidArgument) as e:
        mhf.experts_forward(m, x, wide, wts)
    assert e.value.argument == "topk_ids"
    mhf.set_check_routing(False)
    try:
        y = mhf.experts_forward(m, x, wide, wts)
    finally:
        mhf.set_check_routing(True)
    left_out = wide.clone()
    left_out[3, 2] = -1
    want = ref_moe(x, left_out, wts, gate_up, None, w[2])
    assert rel(y[3], want[3]) < 1e-2 and rel(y, want) < 1e-2
