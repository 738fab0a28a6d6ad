"""The custom ops' outputs are distinct tensors (torch refuses a custom op whose outputs alias
each other or its inputs). Run on the CPU: the backward's real body is registered for CPU
tensors with the GPU launch stubbed out, so torch's own aliasing check runs on its outputs."""
import pytest

torch = pytest.importorskip("torch")
mbt = pytest.importorskip("moeblaze.torch")


def test_backward_outputs_alias_nothing(monkeypatch):
    def launch_stub(dy, x, topk_weights, w_router, *rest):
        return torch.zeros_like(x), torch.zeros(x.shape[0], 2), torch.empty(0, dtype=torch.bfloat16)

    monkeypatch.setattr(mbt, "_launch_backward", launch_stub)
    lib = torch.library.Library("moeblaze", "IMPL")  # noqa: F841 - keeps the CPU kernel registered
    lib.impl("backward", mbt._backward._init_fn, "CPU")
    E, d, n, T = 4, 8, 8, 3
    bf = torch.bfloat16
    x, dy = torch.randn(T, d, dtype=bf), torch.randn(T, d, dtype=bf)
    w1, w2 = torch.randn(E, n, d, dtype=bf), torch.randn(E, d, n, dtype=bf)
    cfg = [E, 2, d, n, 0, 0, 1, 0, 0, 0]
    # No w3, no router, no biases: five of the eight outputs are empty, each its own tensor.
    out = torch.ops.moeblaze.backward(dy, x, torch.rand(T, 2), None, None, w1, None, w2, None, None,
                                      torch.empty(16, dtype=torch.uint8), torch.empty(16, dtype=torch.uint8), cfg, 1.0)
    ptrs = [t.untyped_storage().data_ptr() for t in out if t.numel()]
    assert len(ptrs) == len(set(ptrs))
    assert len({id(t) for t in out}) == len(out)
