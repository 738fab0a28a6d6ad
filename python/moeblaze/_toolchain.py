"""Where the kernels' compiler comes from: NVRTC and the headers the kernels compile against.

The library finds them itself (runtime/toolchain.hpp: CUDA_HOME, CUDA_PATH, NVIDIA's PyPI
packages, the toolkit's usual prefixes). What it cannot know is where this Python keeps NVIDIA's
packages when they are not beside the library (a library loaded from a checkout, packages in
another site-packages): `register_packages` tells it, with what importlib finds, when the
package loads the library."""
from __future__ import annotations

import ctypes
import importlib.metadata
import importlib.util
import json
import os

# The distributions the wheel depends on for its compiler (pyproject.toml).
PACKAGES = ("nvidia-cuda-nvrtc", "nvidia-cuda-runtime", "nvidia-cuda-cccl", "nvidia-cuda-crt", "nvidia-cutlass")


def package_dirs() -> tuple[list[str], str]:
    """NVIDIA's packages as this Python sees them, without importing any: the CUDA roots (every
    site-packages' nvidia/cu13, which holds include/ and lib/ of nvidia-cuda-nvrtc, -runtime,
    -cccl and -crt) and the folder of nvidia-cutlass's C++ headers ("" when not installed)."""
    roots: list[str] = []
    spec = importlib.util.find_spec("nvidia")  # a namespace package: finding it runs nothing
    for folder in (spec.submodule_search_locations or []) if spec else []:
        root = os.path.join(folder, "cu13")
        if os.path.isdir(root) and root not in roots:
            roots.append(root)
    cutlass = ""
    spec = importlib.util.find_spec("cutlass_library")
    if spec and spec.submodule_search_locations:
        folder = os.path.join(spec.submodule_search_locations[0], "source", "include")
        if os.path.isdir(folder):
            cutlass = folder
    return roots, cutlass


def register_packages(lib) -> None:
    """Hands package_dirs() to the library (mb_set_package_dirs) before its first compile."""
    roots, cutlass = package_dirs()
    array = (ctypes.c_char_p * max(len(roots), 1))(*[os.fsencode(r) for r in roots])
    lib.mb_set_package_dirs(array, len(roots), os.fsencode(cutlass) if cutlass else None)


def package_versions() -> dict[str, str]:
    """The installed versions of PACKAGES (those not installed are left out)."""
    out = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def toolchain() -> dict:
    """Where the library finds NVRTC, CUDA's headers and CUTLASS's headers now (opening NVRTC if
    it is not open yet; no GPU needed).

    Returns a dict with "nvrtc", "cuda_headers" and "cutlass_headers", each {"paths": [...],
    "place": where they came from} or, when not found, {"error": every place looked}; the
    "nvrtc_version"; and "packages", the installed versions of NVIDIA's packages."""
    from ._capi import check, lib
    buf = ctypes.create_string_buffer(1 << 16)
    check(lib.mb_toolchain(buf, len(buf)))
    out = json.loads(buf.value.decode(errors="replace"))
    out["packages"] = package_versions()
    return out
