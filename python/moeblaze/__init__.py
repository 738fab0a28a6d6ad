"""moeblaze: MoE layer kernels for Hopper GPUs, generated per shape, NVRTC-compiled, tuned and
cached. `moeblaze.torch` holds the PyTorch layer; this module is the torch-free core."""
from . import _log  # noqa: F401  (the `moeblaze` logger, configured before anything logs)
from ._capi import (InvalidArgument, MoeblazeError, NoGpu, compile_kernels, describe, gpu_available, library_path,
                    make_config, plan_memory, preset, presets)
from ._capi import lib as _lib
from ._toolchain import toolchain

__version__ = _lib.mb_version().decode()

__all__ = ["InvalidArgument", "MoeblazeError", "NoGpu", "compile_kernels", "describe", "gpu_available",
           "library_path", "make_config", "plan_memory", "preset", "presets", "toolchain", "tune", "__version__"]


def tune(model, tokens=None, cache_path=None, budget_s=300.0):
    """Tunes every moeblaze.torch.MoE layer of `model` into the kernel cache and returns one report
    per shape (moeblaze.torch.tune has the details). Minutes a shape: progress goes to the
    `moeblaze` logger; without a GPU every candidate is compiled into the cache but nothing is
    timed, which the report (`"timed": False`) and a warning say."""
    from .torch import tune as _tune
    return _tune(model, tokens, cache_path, budget_s)
