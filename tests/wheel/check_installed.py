"""The installed wheel on a machine without a CUDA toolkit, on the CPU (scripts/wheel.sh runs it
with the virtual environment's Python, no toolkit on the PATH, CUDA_HOME and CUDA_PATH unset):

- the package loads its own libmoeblaze_c.so;
- NVRTC, CUDA's headers and CUTLASS's headers all come from NVIDIA's PyPI packages installed in
  this environment (the wheel's dependencies), none from a toolkit;
- a preset's kernels compile (every family: hand-written GEMMs, the kernel layer's CuTe ones, the
  small kernels), with no spills, into a kernel cache, and a second call takes them from there.

Usage: check_installed.py [PRESET [FAMILY,...]]; the default is every kernel of qwen3-30b-a3b
(16 kernels, two of them CuTe: about a minute on two cores)."""
from __future__ import annotations

import json
import os
import sys
import sysconfig
import tempfile
import time
from pathlib import Path


def fail(msg: str) -> None:
    sys.exit(f"check_installed: {msg}")


def main(preset: str, families: list[str] | None) -> None:
    if os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH"):
        fail("run me without CUDA_HOME and CUDA_PATH: the packages must be found on their own")
    site = Path(sysconfig.get_paths()["purelib"]).resolve()
    import moeblaze
    lib = Path(moeblaze.library_path).resolve()
    if lib.parent != site / "moeblaze":
        fail(f"the package loaded {lib}, not its own library in {site / 'moeblaze'}")

    t = moeblaze.toolchain()
    print("toolchain:", json.dumps(t, indent=1))
    for part in ("nvrtc", "cuda_headers", "cutlass_headers"):
        if t[part].get("error"):
            fail(f"{part} not found: {t[part]['error']}")
        for p in t[part]["paths"]:
            if not Path(p).resolve().is_relative_to(site):
                fail(f"{part} came from {p} ({t[part]['place']}), not from the packages in {site}")
    if not t["nvrtc_version"].startswith("13."):
        fail(f"NVRTC {t['nvrtc_version']}, not 13")

    with tempfile.TemporaryDirectory() as tmp:
        db = str(Path(tmp) / "kernels.db")
        start = time.monotonic()
        report = moeblaze.compile_kernels(preset, families=families, cache_path=db)
        took = time.monotonic() - start
        kernels = report["kernels"]
        print(f"compiled {report['layer']}: {len(kernels)} kernels in {took:.0f} s (NVRTC {report['nvrtc']})")
        for k in kernels:
            print(f"  {k['family']:<14} {k.get('registers', '?'):>3} registers  {k.get('compile_ms', 0) / 1000:5.1f} s"
                  f"  {k.get('kernel', k.get('error'))}")
        if families and sorted(k["family"] for k in kernels) != sorted(families):
            fail(f"asked for {families}, got {[k['family'] for k in kernels]}")
        if report["failed"] or report["compiled"] != len(kernels) or report.get("cache_error"):
            fail(f"not every kernel compiled into the cache: {json.dumps(report)}")
        if not any(k["tile"].endswith("_cute") for k in kernels):
            fail("no kernel of the kernel layer (CuTe) among them: CUTLASS's headers went untested")
        spilled = [k["kernel"] for k in kernels if k["spill_bytes"] or k["stack"]]
        if spilled:
            fail(f"kernels that spill: {spilled}")
        again = moeblaze.compile_kernels(preset, families=families, cache_path=db)
        if again["from_cache"] != len(kernels):
            fail(f"the second call compiled again instead of taking the cache's kernels: {json.dumps(again)}")
    print(f"check_installed: ok ({moeblaze.__version__}, {lib})")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "qwen3-30b-a3b", sys.argv[2].split(",") if len(sys.argv) > 2 else None)
