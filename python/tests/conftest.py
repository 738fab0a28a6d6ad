"""Fixtures shared by the package's tests."""

import pytest


@pytest.fixture
def broken_toolkit(tmp_path):
    """A CUDA_HOME whose cuda_bf16.h is an #error: every NVRTC compile fails at once (quick, and
    no GPU needed to see how a caller reports it)."""
    root = tmp_path / "cuda"
    (root / "include").mkdir(parents=True)
    (root / "include" / "cuda_bf16.h").write_text("#error this toolkit is broken\n")
    return root
