"""docs/api.md is what tools/api_docs.py makes of the docstrings, and every public name has one."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_api_reference_matches_the_docstrings():
    for m in ("torch", "transformers", "torchtitan.models.common.moe", "megatron.core"):
        pytest.importorskip(m)
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "api_docs.py"), "--check"], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr


def test_the_core_functions_have_docstrings():
    import moeblaze
    for name in ("make_config", "plan_memory", "describe", "gpu_available", "NoGpu", "tune", "MoeblazeError",
                 "InvalidArgument"):
        assert (getattr(moeblaze, name).__doc__ or "").strip(), name
