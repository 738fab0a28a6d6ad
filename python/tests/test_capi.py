"""The package without torch and without a GPU: it imports, the C ABI round-trips configs,
shapes and memory plans, and bad arguments raise InvalidArgument naming the argument."""
import ctypes

import pytest

import moeblaze
from moeblaze import _capi as C
from moeblaze._validate import TensorInfo, check_moe_args, check_tensor


def test_imports_and_versions():
    assert moeblaze.__version__.count(".") == 2
    assert C.lib.mb_abi_version() == C.ABI_VERSION
    assert moeblaze.library_path.name == "libmoeblaze_c.so"
    assert isinstance(moeblaze.gpu_available(), bool)


def test_config_round_trip_and_describe():
    cfg = moeblaze.make_config(128, 8, 2048, 768, "swiglu", "softmax", renormalize=True)
    assert (cfg.experts, cfg.topk, cfg.hidden, cfg.ffn, cfg.router, cfg.renormalize) == (128, 8, 2048, 768, 1, 1)
    assert moeblaze.describe(cfg) == "E=128 K=8 d=2048 n=768 swiglu router=softmax,renorm"
    cfg = moeblaze.make_config(256, 8, 7168, 2048, "geglu", "sigmoid", True, 2.5)
    assert moeblaze.describe(cfg) == "E=256 K=8 d=7168 n=2048 geglu router=sigmoid,renorm,scale=2.5"


@pytest.mark.parametrize("args,argument", [
    ((4, 8, 64, 64), "topk"),
    ((0, 1, 64, 64), "experts"),
    ((600, 2, 64, 64), "experts"),
    ((8, 2, 100, 64), "hidden"),
    ((8, 2, 64, 36), "ffn"),
])
def test_bad_shapes_name_the_argument(args, argument):
    with pytest.raises(moeblaze.InvalidArgument) as e:
        moeblaze.make_config(*args)
    assert e.value.argument == argument
    assert argument in str(e.value)


def test_bad_names():
    with pytest.raises(moeblaze.InvalidArgument) as e:
        moeblaze.make_config(8, 2, 64, 64, activation="swish")
    assert e.value.argument == "activation"
    with pytest.raises(moeblaze.InvalidArgument) as e:
        moeblaze.make_config(8, 2, 64, 64, router="top1")
    assert e.value.argument == "router"


def test_memory_plan_through_the_abi():
    cfg = moeblaze.make_config(128, 8, 2048, 768)
    s = moeblaze.plan_memory(cfg, 32768, "save-h")
    r = moeblaze.plan_memory(cfg, 32768, "recompute")
    assert s.h_floor_bytes == 32768 * 8 * 2 * 768 * 2
    assert s.h_floor_bytes <= s.saved_bytes <= 1.1 * s.h_floor_bytes
    assert r.saved_bytes == r.index_bytes < 4 << 20
    with pytest.raises(moeblaze.InvalidArgument) as e:
        moeblaze.plan_memory(cfg, 0)
    assert e.value.argument == "tokens"
    with pytest.raises(moeblaze.InvalidArgument):
        moeblaze.plan_memory(cfg, 16, "fast")


def _forward_args(cfg, T, base=0x7F0000000000):
    """Well-formed forward arguments with fake device addresses (never dereferenced)."""
    E, K, d, n = cfg.experts, cfg.topk, cfg.hidden, cfg.ffn
    plan = moeblaze.plan_memory(cfg, T)
    a = C.ForwardArgs()
    at = [base]

    def nxt(nbytes):
        p = at[0]
        at[0] += (nbytes + 255) // 256 * 256
        return p

    a.x = C.tensor(nxt(T * d * 2), "bf16", (T, d))
    a.topk_ids = C.tensor(nxt(T * K * 4), "i32", (T, K))
    a.topk_weights = C.tensor(nxt(T * K * 4), "f32", (T, K))
    a.w1 = C.tensor(nxt(E * n * d * 2), "bf16", (E, n, d))
    a.w3 = C.tensor(nxt(E * n * d * 2), "bf16", (E, n, d))
    a.w2 = C.tensor(nxt(E * d * n * 2), "bf16", (E, d, n))
    a.y = C.tensor(nxt(T * d * 2), "bf16", (T, d))
    a.saved, a.saved_bytes = nxt(plan.saved_bytes), plan.saved_bytes
    a.scratch, a.scratch_bytes = nxt(plan.forward_scratch_bytes), plan.forward_scratch_bytes
    return a


def _validate(cfg, a):
    C.check(C.lib.mb_validate_forward(ctypes.byref(cfg), ctypes.byref(a)))


def test_forward_arguments_round_trip_shapes():
    cfg = moeblaze.make_config(8, 2, 64, 32, router=None)
    a = _forward_args(cfg, 100)
    _validate(cfg, a)  # accepted as they are
    a.topk_ids.shape[1] = 3
    with pytest.raises(moeblaze.InvalidArgument) as e:
        _validate(cfg, a)
    assert e.value.argument == "topk_ids" and "[100,2]" in str(e.value)
    a = _forward_args(cfg, 100)
    a.w2.shape[1], a.w2.shape[2] = 32, 64  # transposed
    with pytest.raises(moeblaze.InvalidArgument) as e:
        _validate(cfg, a)
    assert e.value.argument == "w2"
    a = _forward_args(cfg, 100)
    a.x.ptr += 2
    with pytest.raises(moeblaze.InvalidArgument) as e:
        _validate(cfg, a)
    assert e.value.argument == "x" and "aligned" in str(e.value)
    a = _forward_args(cfg, 100)
    a.saved_bytes -= 1
    with pytest.raises(moeblaze.InvalidArgument) as e:
        _validate(cfg, a)
    assert e.value.argument == "saved"
    a = _forward_args(cfg, 100)
    a.topk_weights.dtype = C.DTYPES["bf16"]
    with pytest.raises(moeblaze.InvalidArgument) as e:
        _validate(cfg, a)
    assert e.value.argument == "topk_weights"


def _info(dtype, shape, device="cuda", index=0, contiguous=True, ptr=0x10000):
    return TensorInfo(dtype, device, index, tuple(shape), contiguous, ptr)


def test_python_side_checks_name_the_argument():
    cfg = moeblaze.make_config(8, 2, 64, 32, router=None)
    T = 10
    good = dict(x=_info("bf16", (T, 64)), topk_ids=_info("i32", (T, 2)), topk_weights=_info("f32", (T, 2)),
                w_router=None, router_bias=None, w1=_info("bf16", (8, 32, 64)), w3=_info("bf16", (8, 32, 64)),
                w2=_info("bf16", (8, 64, 32)))
    assert check_moe_args(cfg, **good) == T
    cases = [
        ("x", _info("bf16", (T, 64), device="cpu"), "CUDA"),
        ("w1", _info("bf16", (8, 32, 64), index=1), "cuda:0"),
        ("w2", _info("bf16", (8, 64, 32), contiguous=False), "contiguous"),
        ("topk_ids", _info("i64", (T, 2)), "dtype"),
        ("topk_weights", _info("f32", (T, 3)), "shape"),
        ("w3", _info("bf16", (8, 32, 64), ptr=0x10002), "aligned"),
        ("w3", None, "required"),
    ]
    for name, bad, words in cases:
        args = dict(good)
        args[name] = bad
        with pytest.raises(moeblaze.InvalidArgument) as e:
            check_moe_args(cfg, **args)
        assert e.value.argument == name and words in str(e.value), (name, str(e.value))
    with pytest.raises(moeblaze.InvalidArgument) as e:
        check_moe_args(cfg, **{**good, "x": _info("bf16", (0, 64))})
    assert e.value.argument == "x"
    with pytest.raises(moeblaze.InvalidArgument):
        check_tensor("y", None, "bf16", (1, 1), 0)


def test_layer_without_gpu_says_so():
    if moeblaze.gpu_available():
        pytest.skip("a GPU is present")
    cfg = moeblaze.make_config(8, 2, 64, 32)
    h = ctypes.c_void_p()
    with pytest.raises(moeblaze.NoGpu):
        C.check(C.lib.mb_layer_create(ctypes.byref(cfg), 0, b"", 128, ctypes.byref(h)))


def test_tune_checks_its_buffer_and_cache_path_before_tuning(tmp_path, monkeypatch):
    cfg = moeblaze.make_config(8, 2, 64, 64)
    tokens = (ctypes.c_int64 * 1)(64)
    db = tmp_path / "k.db"
    rc = C.lib.mb_tune(ctypes.byref(cfg), tokens, 1, str(db).encode(), 0.0, None, 0)
    assert rc == C.ERR_INVALID_ARGUMENT and C.lib.mb_last_error_argument() == b"buf"
    assert not db.exists(), "nothing may be tuned when the report has nowhere to go"
    # "" is no cache, as for mb_layer_create: refused, not read as the default cache.
    monkeypatch.setenv("MOEBLAZE_CACHE", str(tmp_path / "default.db"))
    buf = ctypes.create_string_buffer(4096)
    rc = C.lib.mb_tune(ctypes.byref(cfg), tokens, 1, b"", 0.0, buf, len(buf))
    assert rc == C.ERR_INVALID_ARGUMENT and C.lib.mb_last_error_argument() == b"cache_path"
    assert b"no cache" in C.lib.mb_last_error()
    assert not (tmp_path / "default.db").exists()


def test_tune_fails_when_candidates_fail_to_compile_and_still_reports(tmp_path, broken_toolkit, monkeypatch):
    if moeblaze.gpu_available():
        pytest.skip("a GPU is present: the compile-only path is not taken")
    monkeypatch.setenv("CUDA_HOME", str(broken_toolkit))
    cfg = moeblaze.make_config(8, 2, 64, 64)
    tokens = (ctypes.c_int64 * 1)(64)
    buf = ctypes.create_string_buffer(1 << 16)
    rc = C.lib.mb_tune(ctypes.byref(cfg), tokens, 1, str(tmp_path / "k.db").encode(), 0.0, buf, len(buf))
    assert rc == C.ERR_COMPILE, C.lib.mb_last_error()
    assert b"failed to compile" in C.lib.mb_last_error()
    import json
    report = json.loads(buf.value.decode())
    assert report["compile_failures"] == report["candidates"] > 0
    assert "this toolkit is broken" in report["shortfall"]


@pytest.mark.parametrize("relative", [False, True])
def test_library_is_found_in_the_build_folder_of_moeblaze_build_dir(tmp_path, relative):
    # A checkout whose package has no library of its own and no build/ beside it, built into
    # a folder elsewhere (scripts/setup.sh honours MOEBLAZE_BUILD_DIR, relative to the checkout).
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path
    checkout = tmp_path / "checkout"
    shutil.copytree(Path(C.__file__).parent, checkout / "python" / "moeblaze",
                    ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    build = tmp_path / "elsewhere"
    (build / "lib").mkdir(parents=True)
    shutil.copy(C.library_path, build / "lib" / "libmoeblaze_c.so")
    env = {k: v for k, v in os.environ.items() if k != "MOEBLAZE_LIBRARY"}
    env["MOEBLAZE_BUILD_DIR"] = "../elsewhere" if relative else str(build)
    env["PYTHONPATH"] = str(checkout / "python")
    p = subprocess.run([sys.executable, "-c", "import moeblaze; print(moeblaze.library_path)"], env=env,
                       capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert p.returncode == 0, p.stderr
    assert Path(p.stdout.strip()).resolve() == (build / "lib" / "libmoeblaze_c.so").resolve()
