"""Compiling without a GPU from Python, and where the compiler comes from: moeblaze.presets,
moeblaze.preset, moeblaze.compile_kernels (mb_compile, what `moeblaze generate` does),
moeblaze.toolchain (mb_toolchain) and the package folders the binding hands to the library
(mb_set_package_dirs). No torch, no GPU."""
import ctypes
import json
import os
import subprocess
import sys

import pytest

import moeblaze
from moeblaze import _capi as C
from moeblaze import _toolchain


def small():
    return moeblaze.make_config(8, 2, 128, 128)


def test_presets_and_a_preset():
    names = moeblaze.presets()
    assert "qwen3-30b-a3b" in names and names == sorted(set(names), key=names.index)
    cfg, tokens = moeblaze.preset("qwen3-30b-a3b")
    assert (cfg.experts, cfg.topk, cfg.hidden, cfg.ffn) == (128, 8, 2048, 768) and tokens > 0
    assert moeblaze.describe(cfg) == "E=128 K=8 d=2048 n=768 swiglu router=softmax,renorm"
    with pytest.raises(moeblaze.InvalidArgument) as e:
        moeblaze.preset("no-such-model")
    assert e.value.argument == "preset" and "qwen3-30b-a3b" in str(e.value)


def test_compile_kernels_into_a_cache_and_back(tmp_path):
    db = str(tmp_path / "kernels.db")
    report = moeblaze.compile_kernels(small(), families=["index_count", "combine"], cache_path=db)
    assert [k["family"] for k in report["kernels"]] == ["index_count", "combine"]
    assert report["compiled"] == 2 and report["failed"] == 0 and report["db"] == db
    assert report["nvrtc"].startswith("13.")
    for k in report["kernels"]:
        assert k["kernel"].startswith(f"mb_{k['family']}_E8_K2_d128_n128") and k["registers"] > 0
        assert k["spill_bytes"] == 0 and not k["from_cache"]
    again = moeblaze.compile_kernels(small(), families="combine", cache_path=db)
    assert again["from_cache"] == 1 and again["compiled"] == 0 and again["kernels"][0]["from_cache"]


def test_compile_kernels_without_a_cache_and_bad_families():
    report = moeblaze.compile_kernels(small(), families=["index_scan"], cache_path="")
    assert report["db"] == "" and report["compiled"] == 1
    with pytest.raises(moeblaze.InvalidArgument) as e:
        moeblaze.compile_kernels(small(), families=["no_such_family"], cache_path="")
    assert e.value.argument == "families"
    # A layer with caller routing has no router kernels.
    caller_routed = moeblaze.make_config(8, 2, 128, 128, router=None)
    with pytest.raises(moeblaze.InvalidArgument, match="router_topk.*not a kernel family of this layer"):
        moeblaze.compile_kernels(caller_routed, families=["router_topk"], cache_path="")
    with pytest.raises(moeblaze.InvalidArgument) as e:
        moeblaze.compile_kernels(small(), tokens=-1, cache_path="")
    assert e.value.argument == "tokens"


def test_a_kernel_that_does_not_compile_is_err_compile_with_the_reason(broken_toolkit):
    # A toolkit whose cuda_bf16.h is broken: the call fails with ERR_COMPILE, the report names it.
    code = (
        "import json, moeblaze\n"
        "try:\n"
        "    moeblaze.compile_kernels(moeblaze.make_config(8, 2, 128, 128), families='combine', cache_path='')\n"
        "except moeblaze.MoeblazeError as e:\n"
        "    print(json.dumps({'code': e.code, 'message': str(e)}))\n")
    env = dict(os.environ, CUDA_HOME=str(broken_toolkit))
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["code"] == C.ERR_COMPILE and "this toolkit is broken" in out["message"]


def test_toolchain_names_every_part():
    t = moeblaze.toolchain()
    for part in ("nvrtc", "cuda_headers", "cutlass_headers"):
        assert set(t[part]) >= {"paths", "place"}
        assert t[part].get("error") or (t[part]["paths"] and t[part]["place"])
    assert not t["nvrtc"].get("error"), t["nvrtc"]  # the compiles above found it
    assert t["nvrtc_version"].startswith("13.") and "libnvrtc.so.13" in t["nvrtc"]["paths"][0]
    assert isinstance(t["packages"], dict)


def test_package_dirs_are_what_this_python_has():
    roots, cutlass = _toolchain.package_dirs()
    for r in roots:
        assert r.endswith(os.path.join("nvidia", "cu13")) and os.path.isdir(r)
    if cutlass:
        assert os.path.isfile(os.path.join(cutlass, "cutlass", "version.h"))


def test_registered_packages_come_before_the_toolkit(tmp_path):
    """With CUDA_HOME and CUDA_PATH unset, NVRTC comes from NVIDIA's packages this Python has
    (the binding registers them) rather than from a toolkit."""
    roots, _ = _toolchain.package_dirs()
    if not any(os.path.isfile(os.path.join(r, "lib", "libnvrtc.so.13")) for r in roots):
        pytest.skip("nvidia-cuda-nvrtc is not installed for this Python")
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH", "VIRTUAL_ENV", "CONDA_PREFIX")}
    code = "import json, moeblaze; print(json.dumps(moeblaze.toolchain()))"
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    t = json.loads(p.stdout)
    assert t["nvrtc"]["place"] in ("NVIDIA's PyPI packages registered by the host program",
                                   "NVIDIA's PyPI packages beside this library"), t["nvrtc"]
    assert any(t["nvrtc"]["paths"][0].startswith(r) for r in roots)


def test_set_package_dirs_checks_its_arguments():
    assert C.lib.mb_set_package_dirs(None, -1, None) == C.ERR_INVALID_ARGUMENT
    assert C.lib.mb_last_error_argument() == b"n_roots"
    assert C.lib.mb_set_package_dirs(None, 1, None) == C.ERR_INVALID_ARGUMENT
    assert C.lib.mb_last_error_argument() == b"cuda_roots"
    # Back to what the binding registered at import.
    _toolchain.register_packages(C.lib)
    assert C.lib.mb_toolchain(ctypes.create_string_buffer(8), 0) == C.ERR_INVALID_ARGUMENT
