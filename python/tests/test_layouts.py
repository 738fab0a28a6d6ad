"""The fused gate_up layout, GPT-OSS's activation and expert biases through the C ABI and the
Python-side checks, without a GPU: configs round-trip and describe themselves, and arguments of
the wrong layout raise InvalidArgument naming the argument."""
import ctypes

import pytest

import moeblaze
from moeblaze import _capi as C
from moeblaze._validate import TensorInfo, check_moe_args


def _info(dtype, shape, ptr=0x10000):
    return TensorInfo(dtype, "cuda", 0, tuple(shape), True, ptr)


def test_configs_round_trip_and_describe():
    cfg = moeblaze.make_config(8, 2, 64, 32, weight_layout="fused")
    assert cfg.weight_layout == 1 and cfg.expert_bias == 0
    assert moeblaze.describe(cfg) == "E=8 K=2 d=64 n=32 swiglu router=softmax gate_up=fused"
    cfg = moeblaze.make_config(32, 4, 2880, 2880, "clamped_swiglu", None, weight_layout="fused", expert_bias=True)
    assert moeblaze.describe(cfg) == "E=32 K=4 d=2880 n=2880 clamped_swiglu router=none gate_up=fused bias"
    # The separate layout keeps the description it always had (and so the cache keys).
    assert moeblaze.describe(moeblaze.make_config(8, 2, 64, 32)) == "E=8 K=2 d=64 n=32 swiglu router=softmax"


def test_bad_layouts_name_the_argument():
    with pytest.raises(moeblaze.InvalidArgument) as e:
        moeblaze.make_config(8, 2, 64, 32, "silu", weight_layout="fused")  # no W3 to fuse
    assert e.value.argument == "weight_layout" and "gated" in str(e.value)
    with pytest.raises(moeblaze.InvalidArgument) as e:
        moeblaze.make_config(8, 2, 64, 32, weight_layout="interleaved")
    assert e.value.argument == "weight_layout"
    cfg = moeblaze.make_config(8, 2, 64, 32)
    cfg.weight_layout = 7
    with pytest.raises(moeblaze.InvalidArgument) as e:
        C.check(C.lib.mb_config_validate(ctypes.byref(cfg)))
    assert e.value.argument == "weight_layout"


def test_memory_plan_does_not_depend_on_the_layout():
    a = moeblaze.plan_memory(moeblaze.make_config(64, 8, 1024, 512), 4096)
    b = moeblaze.plan_memory(moeblaze.make_config(64, 8, 1024, 512, weight_layout="fused"), 4096)
    assert (a.saved_bytes, a.forward_scratch_bytes, a.backward_scratch_bytes) == \
        (b.saved_bytes, b.forward_scratch_bytes, b.backward_scratch_bytes)


def test_python_checks_of_the_fused_layout_and_biases():
    E, K, d, n, T = 8, 2, 64, 32, 10
    cfg = moeblaze.make_config(E, K, d, n, "clamped_swiglu", None, weight_layout="fused", expert_bias=True)
    good = dict(x=_info("bf16", (T, d)), topk_ids=_info("i32", (T, K)), topk_weights=_info("f32", (T, K)),
                w_router=None, router_bias=None, w1=_info("bf16", (E, 2 * n, d)), w3=None,
                w2=_info("bf16", (E, d, n)), bias_up=_info("bf16", (E, 2 * n)), bias_down=_info("bf16", (E, d)))
    assert check_moe_args(cfg, **good) == T
    cases = [
        ("w1", _info("bf16", (E, n, d)), "shape"),           # the separate layout's W1
        ("w3", _info("bf16", (E, n, d)), "second half"),     # W3 given beside a fused gate_up
        ("bias_up", None, "required"),
        ("bias_up", _info("bf16", (E, n)), "shape"),         # only the gate half
        ("bias_down", _info("f32", (E, d)), "dtype"),
    ]
    for name, bad, words in cases:
        with pytest.raises(moeblaze.InvalidArgument) as e:
            check_moe_args(cfg, **{**good, name: bad})
        assert e.value.argument == name and words in str(e.value), (name, str(e.value))
    plain = moeblaze.make_config(E, K, d, n, router=None)
    with pytest.raises(moeblaze.InvalidArgument) as e:
        check_moe_args(plain, **{**good, "w1": _info("bf16", (E, n, d)), "w3": _info("bf16", (E, n, d))})
    assert e.value.argument == "bias_up" and "no expert biases" in str(e.value)


def test_c_abi_checks_biases_and_accumulate_fields():
    """The ABI's forward/backward structs carry the biases (validated in C++ as in Python)."""
    E, K, d, n, T = 8, 2, 64, 32, 16
    cfg = moeblaze.make_config(E, K, d, n, "clamped_swiglu", None, weight_layout="fused", expert_bias=True)
    plan = moeblaze.plan_memory(cfg, T)
    at = [0x7F0000000000]

    def nxt(nbytes):
        p = at[0]
        at[0] += (nbytes + 255) // 256 * 256
        return p

    a = C.ForwardArgs()
    a.x = C.tensor(nxt(T * d * 2), "bf16", (T, d))
    a.topk_ids = C.tensor(nxt(T * K * 4), "i32", (T, K))
    a.topk_weights = C.tensor(nxt(T * K * 4), "f32", (T, K))
    a.w1 = C.tensor(nxt(E * 2 * n * d * 2), "bf16", (E, 2 * n, d))
    a.w2 = C.tensor(nxt(E * d * n * 2), "bf16", (E, d, n))
    a.y = C.tensor(nxt(T * d * 2), "bf16", (T, d))
    a.saved, a.saved_bytes = nxt(plan.saved_bytes), plan.saved_bytes
    a.scratch, a.scratch_bytes = nxt(plan.forward_scratch_bytes), plan.forward_scratch_bytes
    with pytest.raises(moeblaze.InvalidArgument) as e:  # the biases are missing
        C.check(C.lib.mb_validate_forward(ctypes.byref(cfg), ctypes.byref(a)))
    assert e.value.argument == "bias_up"
    a.bias_up = C.tensor(nxt(E * 2 * n * 2), "bf16", (E, 2 * n))
    a.bias_down = C.tensor(nxt(E * d * 2), "bf16", (E, d))
    C.check(C.lib.mb_validate_forward(ctypes.byref(cfg), ctypes.byref(a)))
    a.bias_down = C.tensor(a.bias_down.ptr, "bf16", (E, d + 8))
    with pytest.raises(moeblaze.InvalidArgument) as e:
        C.check(C.lib.mb_validate_forward(ctypes.byref(cfg), ctypes.byref(a)))
    assert e.value.argument == "bias_down"
    assert hasattr(C.BackwardArgs(), "accumulate") and hasattr(C.BackwardArgs(), "d_bias_up")
