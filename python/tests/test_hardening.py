"""Careless and hostile input through Python, without a GPU: numbers that ctypes would truncate,
non-finite values, overflowing token counts, CPU tensors, a MOEBLAZE_LIBRARY that does not
exist, and layer handles that tune() must destroy. The C ABI is also called directly with the
values Python refuses, to show it refuses them on its own."""
import ctypes
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

import moeblaze
from moeblaze import _capi as C
from moeblaze._validate import check_device, check_int, check_real


def _raises(argument, fn, *args, words=None, **kw):
    with pytest.raises(moeblaze.InvalidArgument) as e:
        fn(*args, **kw)
    assert e.value.argument == argument, str(e.value)
    if words:
        assert words in str(e.value), str(e.value)
    return e.value


def test_counts_that_ctypes_would_truncate_are_refused():
    # 2**32 + 8 reaches a C int32 as 8: it must be refused, not run as E = 8.
    _raises("experts", moeblaze.make_config, 2**32 + 8, 2, 64, 64, words=str(2**32 + 8))
    _raises("topk", moeblaze.make_config, 8, 2**32 + 2, 64, 64)
    _raises("hidden", moeblaze.make_config, 8, 2, -(2**32) + 64, 64)
    _raises("ffn", moeblaze.make_config, 8, 2, 64, 2**31)
    _raises("experts", moeblaze.make_config, 8.0, 2, 64, 64, words="integer")
    _raises("experts", moeblaze.make_config, True, 1, 64, 64, words="bool")
    _raises("experts", moeblaze.make_config, "8", 2, 64, 64, words="integer")


@pytest.mark.parametrize("scale", [math.nan, math.inf, -math.inf, 0.0, -1.0, 1e39, "x"])
def test_route_scale_must_be_finite_and_positive(scale):
    _raises("route_scale", moeblaze.make_config, 8, 2, 64, 64, route_scale=scale)


def test_the_c_abi_refuses_on_its_own():
    def validate(**fields):
        cfg = C.LayerConfig(8, 2, 64, 64, 0, 1, 0, 1.0)
        for k, v in fields.items():
            setattr(cfg, k, v)
        code = C.lib.mb_config_validate(ctypes.byref(cfg))
        return code, C.lib.mb_last_error_argument().decode(), C.lib.mb_last_error().decode()

    assert validate()[0] == C.OK
    for fields, argument in [({"route_scale": math.inf}, "route_scale"), ({"route_scale": math.nan}, "route_scale"),
                             ({"hidden": 2147483640}, "hidden"), ({"ffn": 65544}, "ffn"), ({"experts": -8}, "experts"),
                             ({"activation": 99}, "activation"), ({"router": -1}, "router")]:
        code, arg, msg = validate(**fields)
        assert code == C.ERR_INVALID_ARGUMENT and arg == argument, (fields, arg, msg)


def test_token_counts_that_overflow_are_refused():
    cfg = moeblaze.make_config(16, 16, 256, 256, router=None)
    e = _raises("tokens", moeblaze.plan_memory, cfg, 2**60)  # T*K wraps to 0 in 64 bits
    assert "2^31" in str(e)
    _raises("tokens", moeblaze.plan_memory, cfg, 2**27)  # T*K = 2^31 exactly
    assert moeblaze.plan_memory(cfg, 2**27 - 1).saved_bytes > 0
    _raises("tokens", moeblaze.plan_memory, cfg, 2**64)  # does not fit an int64: refused in Python
    _raises("tokens", moeblaze.plan_memory, cfg, 0)
    out = C.MemoryPlan()
    assert C.lib.mb_plan_memory(ctypes.byref(cfg), 2**60, 0, ctypes.byref(out)) == C.ERR_INVALID_ARGUMENT
    assert C.lib.mb_last_error_argument() == b"tokens"


def test_forward_validation_refuses_a_small_buffer_for_an_overflowing_t():
    # T = 2^60 tokens, K = 16: T*K overflows; a 1 KiB saved buffer used to be accepted.
    cfg = moeblaze.make_config(16, 16, 256, 256, router=None)
    T, base = 2**60, 0x7F0000000000
    a = C.ForwardArgs()
    a.x = C.tensor(base, "bf16", (T, 256))
    a.topk_ids = C.tensor(base + 0x1000, "i32", (T, 16))
    a.topk_weights = C.tensor(base + 0x2000, "f32", (T, 16))
    a.w1 = C.tensor(base + 0x3000, "bf16", (16, 256, 256))
    a.w3 = C.tensor(base + 0x4000, "bf16", (16, 256, 256))
    a.w2 = C.tensor(base + 0x5000, "bf16", (16, 256, 256))
    a.y = C.tensor(base + 0x6000, "bf16", (T, 256))
    a.saved, a.saved_bytes = base + 0x8000, 1024
    a.scratch, a.scratch_bytes = base + 0x9000, 1024
    code = C.lib.mb_validate_forward(ctypes.byref(cfg), ctypes.byref(a))
    assert code == C.ERR_INVALID_ARGUMENT
    assert C.lib.mb_last_error_argument() == b"x"
    assert b"2^31" in C.lib.mb_last_error()


def test_tune_and_layer_arguments_are_checked_before_any_work(tmp_path):
    cfg = moeblaze.make_config(8, 2, 64, 64, router=None)
    buf = ctypes.create_string_buffer(4096)
    db = str(tmp_path / "k.db").encode()
    one = (ctypes.c_int64 * 1)(100)
    for budget in (math.nan, math.inf, -1.0):
        assert C.lib.mb_tune(ctypes.byref(cfg), one, 1, db, budget, buf, len(buf)) == C.ERR_INVALID_ARGUMENT
        assert C.lib.mb_last_error_argument() == b"budget_s"
    huge = (ctypes.c_int64 * 1)(2**60)
    assert C.lib.mb_tune(ctypes.byref(cfg), huge, 1, db, 1.0, buf, len(buf)) == C.ERR_INVALID_ARGUMENT
    assert C.lib.mb_last_error_argument() == b"tokens"
    h = ctypes.c_void_p()
    assert C.lib.mb_layer_create(ctypes.byref(cfg), 0, b"", -5, ctypes.byref(h)) == C.ERR_INVALID_ARGUMENT
    assert C.lib.mb_last_error_argument() == b"tokens"
    assert not (tmp_path / "k.db").exists()  # nothing was created for refused arguments


def test_python_number_checks():
    assert check_int("n", 7, 1, 8) == 7
    _raises("n", check_int, "n", 9, 1, 8)
    _raises("n", check_int, "n", 2.0, 1, 8)
    assert check_real("s", 2, 0, 3) == 2.0
    _raises("s", check_real, "s", math.nan, 0, 3, words="finite")
    _raises("s", check_real, "s", 0.0, 0, 3, positive=True)
    _raises("x", check_device, "x", "cpu", words="CUDA")
    check_device("x", "cuda")


def test_missing_moeblaze_library_is_an_error_naming_it(tmp_path):
    missing = tmp_path / "nowhere" / "libmoeblaze_c.so"
    env = {**os.environ, "MOEBLAZE_LIBRARY": str(missing)}
    p = subprocess.run([sys.executable, "-c", "import moeblaze"], env=env, capture_output=True, text=True)
    assert p.returncode != 0
    assert "MOEBLAZE_LIBRARY" in p.stderr and str(missing) in p.stderr, p.stderr
    not_a_library = tmp_path / "libmoeblaze_c.so"
    not_a_library.write_text("not a shared library")
    env["MOEBLAZE_LIBRARY"] = str(not_a_library)
    p = subprocess.run([sys.executable, "-c", "import moeblaze"], env=env, capture_output=True, text=True)
    assert p.returncode != 0
    assert "MOEBLAZE_LIBRARY" in p.stderr and "cannot load" in p.stderr, p.stderr


# ---- moeblaze.torch (CPU torch is enough) ----------------------------------------------------

def _torch():
    return pytest.importorskip("torch")


def test_module_counts_are_checked_under_their_names():
    _torch()
    import moeblaze.torch as mbt
    _raises("num_experts", mbt.MoE, num_experts=2**32 + 8, top_k=2, hidden=64, ffn=64)
    _raises("top_k", mbt.MoE, num_experts=8, top_k=2**32 + 1, hidden=64, ffn=64)
    _raises("num_experts", mbt.MoE, num_experts=600, top_k=2, hidden=64, ffn=64)
    _raises("top_k", mbt.MoE, num_experts=4, top_k=8, hidden=64, ffn=64)
    _raises("route_scale", mbt.MoE, num_experts=8, top_k=2, hidden=64, ffn=64, route_scale=math.inf)


def test_cpu_tensors_get_invalid_argument_naming_them():
    torch = _torch()
    import moeblaze.torch as mbt
    m = mbt.MoE(num_experts=8, top_k=2, hidden=64, ffn=64)  # weights on the CPU
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    _raises("x", m, x, words="is on cpu, expected a CUDA tensor")
    w1 = torch.randn(8, 64, 64, dtype=torch.bfloat16)
    _raises("x", mbt.moe, x, w1, w1, w1, w_router=torch.randn(8, 64, dtype=torch.bfloat16), top_k=2)
    if torch.cuda.is_available():
        _raises("w1", m, x.cuda(), words="is on cpu")


class _RecordingLibrary:
    """The C library with layer creation, tuning and destruction replaced: records what tune()
    destroys, without a GPU."""

    def __init__(self, lib):
        self._lib, self.destroyed, self.tuned = lib, [], 0

    def __getattr__(self, name):
        return getattr(self._lib, name)

    def mb_layer_destroy(self, h):
        self.destroyed.append(h.value if isinstance(h, ctypes.c_void_p) else h)

    def mb_tune(self, cfg, arr, n, path, budget, buf, size):
        self.tuned += 1
        buf.value = b'{"families": []}'
        return C.OK


@pytest.mark.parametrize("fail", [False, True])
def test_tune_destroys_the_layer_handles(monkeypatch, fail):
    _torch()
    import moeblaze.torch as mbt
    rec = _RecordingLibrary(C.lib)
    if fail:
        rec.mb_tune = lambda *a: (_ for _ in ()).throw(RuntimeError("tuning failed"))
    monkeypatch.setattr(C, "lib", rec)
    handles = [ctypes.c_void_p(0x1000 + i) for i in range(3)]
    monkeypatch.setattr(mbt, "_layers", {("k", i): h for i, h in enumerate(handles)})
    m = mbt.MoE(num_experts=8, top_k=2, hidden=64, ffn=64)
    if fail:
        with pytest.raises(RuntimeError):
            moeblaze.tune(m, tokens=[128])
    else:
        assert moeblaze.tune(m, tokens=[128]) == [{"families": []}]
    assert sorted(rec.destroyed) == [0x1000, 0x1001, 0x1002]
    assert mbt._layers == {}


def test_tune_checks_its_numbers():
    _torch()
    import moeblaze.torch as mbt
    m = mbt.MoE(num_experts=8, top_k=2, hidden=64, ffn=64)
    _raises("budget_s", moeblaze.tune, m, tokens=[128], budget_s=math.nan)
    _raises("tokens", moeblaze.tune, m, tokens=[2**64])
    _raises("tokens", moeblaze.tune, m, tokens=[0])
