"""Caller routing's Python side without a GPU: ids are range-checked before they are narrowed
to int32, the routing check reaches the C ABI (and is skipped during a CUDA-graph capture and
for the built-in routers), and moeblaze.hf passes it on. The GPU side (the kernels leaving bad
picks out, the error itself) is test_routing_gpu.py."""
import ctypes

import pytest

torch = pytest.importorskip("torch")

import moeblaze._routing as routing  # noqa: E402
import moeblaze.torch as mbt  # noqa: E402
from moeblaze import InvalidArgument  # noqa: E402
from moeblaze import _capi as C  # noqa: E402


@pytest.mark.parametrize("dtype", [torch.int64, torch.int16, torch.uint8])
def test_wide_ids_outside_the_experts_become_the_left_out_id_before_the_cast(dtype):
    big = 2**32 + 3 if dtype == torch.int64 else 200  # int64 2**32 + 3 would wrap to expert 3
    ids = torch.tensor([[3, big], [0, 7]], dtype=dtype)
    out = routing.narrow_expert_ids(ids, 8)
    assert out.dtype == torch.int32
    assert out.tolist() == [[3, routing.LEFT_OUT_ID], [0, 7]]
    if dtype.is_signed:
        neg = routing.narrow_expert_ids(torch.tensor([-1, -(2**40) if dtype == torch.int64 else -5, 8], dtype=dtype), 8)
        assert neg.tolist() == [routing.LEFT_OUT_ID] * 3


def test_int32_ids_pass_through_unchanged():
    ids = torch.tensor([[1, 9]], dtype=torch.int32)
    assert routing.narrow_expert_ids(ids, 8) is ids  # the index build checks their range


def test_non_integer_ids_are_refused_naming_topk_ids():
    with pytest.raises(InvalidArgument) as e:
        routing.narrow_expert_ids(torch.tensor([[1.0, 2.0]]), 8)
    assert e.value.argument == "topk_ids"


def test_the_check_is_skipped_while_a_cuda_graph_is_captured(monkeypatch):
    assert routing.routing_check_active(True)
    assert not routing.routing_check_active(False)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert not routing.routing_check_active(True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert routing.routing_check_active(True)


class FakeLib:
    """The C ABI calls the forward op makes, recording what mb_layer_forward was asked."""

    def __init__(self, real, fail_with=None):
        self.real, self.fail_with, self.check_routing = real, fail_with, []

    def __getattr__(self, name):
        return getattr(self.real, name)

    def mb_layer_plan_memory(self, h, tokens, mode, out):
        plan = out._obj
        plan.saved_bytes, plan.forward_scratch_bytes, plan.backward_scratch_bytes = 4096, 64, 64
        return C.OK

    def mb_layer_forward(self, h, args, stream, state):
        a, st = args._obj, state._obj
        self.check_routing.append(a.check_routing)
        st.expert_counts = a.saved
        if self.fail_with:
            return self.fail_with
        return C.OK


def fake_forward(monkeypatch, fake, router=0, capturing=False):
    """Runs the forward op's real body on CPU tensors with the C ABI faked."""
    monkeypatch.setattr(C, "lib", fake)
    monkeypatch.setattr(mbt, "_layer", lambda *a, **k: ctypes.c_void_p(1))
    monkeypatch.setattr(routing.torch.cuda, "is_initialized", lambda: capturing)
    monkeypatch.setattr(routing.torch.cuda, "is_current_stream_capturing", lambda: capturing)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: type("S", (), {"cuda_stream": 0})())
    monkeypatch.setattr(mbt, "check_moe_args", lambda *a: 3)
    E, K, d, n = 4, 2, 8, 8
    bf = torch.bfloat16
    x = torch.zeros(3, d, dtype=bf)
    w1, w3, w2 = torch.zeros(E, n, d, dtype=bf), torch.zeros(E, n, d, dtype=bf), torch.zeros(E, d, n, dtype=bf)
    ids, wts = torch.zeros(3, K, dtype=torch.int32), torch.zeros(3, K)
    cfg = [E, K, d, n, 0, router, 0, 0, 0]
    def run(check):
        return mbt._forward._init_fn(x, ids if not router else None, wts if not router else None,
                                     torch.zeros(E, d, dtype=bf) if router else None, None, w1, w3, w2, None, None,
                                     cfg, 1.0, 0, check)
    return run


def test_the_forward_op_asks_the_c_abi_for_the_check(monkeypatch):
    fake = FakeLib(C.lib)
    run = fake_forward(monkeypatch, fake)
    run(True)
    run(False)
    assert fake.check_routing == [1, 0]


def test_the_built_in_routers_never_check(monkeypatch):
    fake = FakeLib(C.lib)
    fake_forward(monkeypatch, fake, router=1)(True)
    assert fake.check_routing == [0]


def test_a_capture_skips_the_check(monkeypatch):
    fake = FakeLib(C.lib)
    fake_forward(monkeypatch, fake, capturing=True)(True)
    assert fake.check_routing == [0]


def test_the_routing_error_says_how_to_leave_picks_out(monkeypatch):
    fake = FakeLib(C.lib, fail_with=C.ERR_INVALID_ARGUMENT)
    monkeypatch.setattr(FakeLib, "mb_last_error_argument", lambda self: b"topk_ids", raising=False)
    monkeypatch.setattr(FakeLib, "mb_last_error", lambda self: b"topk_ids: an id is outside [0, 4)", raising=False)
    run = fake_forward(monkeypatch, fake)
    with pytest.raises(InvalidArgument) as e:
        run(True)
    assert e.value.argument == "topk_ids" and "outside [0, 4)" in str(e.value)
    assert "check_routing=False" in str(e.value)


def test_the_fake_implementation_takes_the_flag():
    from torch._subclasses.fake_tensor import FakeTensorMode
    E, K, d, n, T = 4, 2, 8, 8, 3
    with FakeTensorMode():
        bf = torch.bfloat16
        y, saved, state, counts, gates = torch.ops.moeblaze.forward(
            torch.empty(T, d, dtype=bf), torch.empty(T, K, dtype=torch.int32), torch.empty(T, K), None, None,
            torch.empty(E, n, d, dtype=bf), torch.empty(E, n, d, dtype=bf), torch.empty(E, d, n, dtype=bf), None, None,
            [E, K, d, n, 0, 0, 0, 0, 0], 1.0, 0, True)
        assert y.shape == (T, d) and counts.shape == (E,) and gates.numel() == 0


def test_moe_and_the_module_pass_the_flag_on(monkeypatch):
    seen = []

    def op(*args):
        seen.append(args[13])
        T, d = args[0].shape
        return torch.zeros(T, d), None, None, torch.zeros(4, dtype=torch.int32), torch.zeros(0)

    monkeypatch.setattr(mbt, "_check_devices", lambda **tensors: None)
    monkeypatch.setattr(torch.ops.moeblaze, "forward", op)
    E, K, d, n = 4, 2, 8, 8
    bf = torch.bfloat16
    x, ids, wts = torch.zeros(3, d, dtype=bf), torch.zeros(3, K, dtype=torch.int32), torch.zeros(3, K)
    w1, w3, w2 = torch.zeros(E, n, d, dtype=bf), torch.zeros(E, n, d, dtype=bf), torch.zeros(E, d, n, dtype=bf)
    mbt.moe(x, w1, w3, w2, topk_ids=ids, topk_weights=wts)
    mbt.moe(x, w1, w3, w2, topk_ids=ids, topk_weights=wts, check_routing=False)
    m = mbt.MoE(E, K, d, n, router=None)
    m(x, ids, wts)
    m(x, ids, wts, check_routing=False)
    assert seen == [True, False, True, False]  # on by default


def test_hf_narrows_after_the_range_check_and_passes_the_flag(monkeypatch):
    pytest.importorskip("transformers")
    import moeblaze.hf as mhf
    from hf_configs import experts_modules, small_config
    import transformers
    model = transformers.AutoModelForCausalLM.from_config(small_config("qwen3_moe"), experts_implementation="eager",
                                                          dtype=torch.bfloat16)
    m = experts_modules(model)[0]
    seen = []

    def fake_moe(x, w1, w3, w2, **kw):
        seen.append((kw["topk_ids"], kw["check_routing"]))
        return mbt.MoEOutput(torch.zeros_like(x), None, None)

    monkeypatch.setattr(mhf, "_check_inputs", lambda *a: None)
    monkeypatch.setattr(mbt, "moe", fake_moe)
    E = m.num_experts
    x = torch.zeros(2, mhf.experts_spec(m).hidden, dtype=torch.bfloat16)
    ids = torch.tensor([[1, 2**32 + 3], [E, 0]], dtype=torch.int64)
    mhf.experts_forward(m, x, ids, torch.zeros(2, 2))
    mhf.set_check_routing(False)
    try:
        mhf.experts_forward(m, x, ids, torch.zeros(2, 2))
    finally:
        mhf.set_check_routing(True)
    (got, check), (_, check_off) = seen
    assert got.dtype == torch.int32 and got.tolist() == [[1, -1], [-1, 0]]  # not expert 3, not expert E
    assert check is True and check_off is False
