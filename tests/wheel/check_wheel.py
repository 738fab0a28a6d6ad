"""Checks a built moeblaze wheel before it is installed anywhere (scripts/wheel.sh runs it):

- the name: moeblaze-<version>-py3-none-manylinux_2_28_x86_64.whl (ctypes, no CPython
  extension: one wheel for every Python 3);
- the files: the package, libmoeblaze_c.so as its only shared library, CHANGELOG.md, the licence;
- the library: needs nothing outside glibc 2.28's libraries and libgcc_s (no libstdc++, no
  libnvrtc, no libcuda: both are opened at run time), no glibc symbol version after 2.28, no
  GLIBCXX or CXXABI version (libstdc++ is linked in), and exports the C ABI (mb_*) only.
auditwheel has judged the platform tag already; this names each property on its own, so a
failure says which one went.

Usage: check_wheel.py WHEEL (objdump from binutils on the PATH)."""
from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

GLIBC_MAX = (2, 28)
# manylinux_2_28's libraries that a wheel may need from the system (PEP 600 / auditwheel policy),
# less libstdc++: linked in, since the system's may be older than the compiler's.
ALLOWED_NEEDED = {"libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1", "libgcc_s.so.1",
                  "ld-linux-x86-64.so.2"}


def fail(msg: str) -> None:
    sys.exit(f"check_wheel: {msg}")


def objdump(flag: str, path: Path) -> str:
    return subprocess.run(["objdump", flag, str(path)], check=True, capture_output=True, text=True).stdout


def main(wheel: Path) -> None:
    m = re.fullmatch(r"moeblaze-([0-9][^-]*)-py3-none-manylinux_2_28_x86_64\.whl", wheel.name)
    if not m:
        fail(f"{wheel.name}: not moeblaze-<version>-py3-none-manylinux_2_28_x86_64.whl")
    version = m.group(1)
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        dist_info = f"moeblaze-{version}.dist-info"
        for need in ("moeblaze/__init__.py", "moeblaze/_capi.py", "moeblaze/libmoeblaze_c.so", "moeblaze/CHANGELOG.md",
                     f"{dist_info}/licenses/LICENSE", f"{dist_info}/METADATA"):
            if need not in names:
                fail(f"{need} is not in the wheel")
        libraries = [n for n in names if re.search(r"\.so(\.|$)", n)]
        if libraries != ["moeblaze/libmoeblaze_c.so"]:
            fail(f"shared libraries in the wheel: {libraries} (only moeblaze/libmoeblaze_c.so belongs there)")
        metadata = z.read(f"{dist_info}/METADATA").decode()
        for dep in ("nvidia-cuda-nvrtc", "nvidia-cuda-runtime", "nvidia-cuda-cccl", "nvidia-cuda-crt", "nvidia-cutlass"):
            if not re.search(rf"^Requires-Dist: {dep}\b", metadata, re.M):
                fail(f"METADATA does not require {dep}")
        with tempfile.TemporaryDirectory() as tmp:
            lib = Path(z.extract("moeblaze/libmoeblaze_c.so", tmp))
            dynamic = objdump("-p", lib)
            symbols = objdump("-T", lib)
    needed = set(re.findall(r"^\s*NEEDED\s+(\S+)", dynamic, re.M))
    if needed - ALLOWED_NEEDED:
        fail(f"libmoeblaze_c.so needs {sorted(needed - ALLOWED_NEEDED)}, outside manylinux_2_28's allowed libraries")
    glibc = {tuple(int(x) for x in v.split(".")) for v in re.findall(r"\bGLIBC_([0-9.]+)", symbols)}
    newer = sorted(v for v in glibc if v > GLIBC_MAX)
    if newer:
        late = [line.split()[-1] for line in symbols.splitlines()
                if any(f"GLIBC_{'.'.join(map(str, v))})" in line for v in newer)]
        fail(f"libmoeblaze_c.so needs glibc {'.'.join(map(str, newer[-1]))} (symbols {late}); manylinux_2_28 has 2.28")
    cxx = sorted(set(re.findall(r"\b((?:GLIBCXX|CXXABI)_[0-9.]+)", symbols)))
    if cxx:
        fail(f"libmoeblaze_c.so needs the system's libstdc++ ({cxx}); it should link it in")
    exported = [line.split()[-1] for line in symbols.splitlines()
                if re.search(r"\s(DF|DO)\s", line) and "*UND*" not in line]
    stray = [s for s in exported if not s.startswith("mb_")]
    if stray:
        fail(f"libmoeblaze_c.so exports more than the C ABI: {stray[:10]}")
    print(f"check_wheel: {wheel.name}: files, tag and library fine (needs {', '.join(sorted(needed))}; "
          f"glibc up to {'.'.join(map(str, max(glibc)))}; exports {len(exported)} mb_* functions)")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(Path(sys.argv[1]))
