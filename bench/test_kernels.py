"""CPU tests of bench/kernels.py's profiler reading: op nesting and the GPU records built from
kineto events (fake ones here: the real ones need a GPU)."""
import pytest

from kernels import op_chains, records_from


def test_op_chains_follow_nesting_per_thread():
    ops = [(1, "outer", 7, 0, 100), (2, "mid", 7, 10, 60), (3, "inner", 7, 20, 30), (4, "sibling", 7, 61, 90),
           (5, "other_thread", 8, 15, 25), (6, "instant", 7, 10, 10)]
    c = op_chains(ops)
    assert c[3] == ["inner", "mid", "outer"]
    assert c[4] == ["sibling", "outer"]
    assert c[5] == ["other_thread"]  # a different thread never nests in thread 7's ops
    assert c[6] == ["instant", "mid", "outer"]  # zero length at its parent's start


def test_op_chains_do_not_nest_an_op_in_one_that_ends_first():
    c = op_chains([(1, "a", 1, 0, 50), (2, "b", 1, 40, 80), (3, "c", 1, 45, 46)])
    assert c[2] == ["b"]
    assert c[3] == ["c", "b"]


class FakeEvent:
    def __init__(self, name, device, corr, linked, thread, start, end, shapes=()):
        self._v = (name, device, corr, linked, thread, start, end, list(shapes))

    def name(self): return self._v[0]
    def device_type(self): return self._v[1]
    def correlation_id(self): return self._v[2]
    def linked_correlation_id(self): return self._v[3]
    def start_thread_id(self): return self._v[4]
    def start_ns(self): return self._v[5]
    def end_ns(self): return self._v[6]
    def duration_ns(self): return self._v[6] - self._v[5]
    def shapes(self): return self._v[7]


class FakeProfile:
    def __init__(self, events):
        self.profiler = type("P", (), {"kineto_results": type("R", (), {"events": lambda _self: events})()})()


def test_records_link_kernels_to_their_ops_and_keep_gpu_order():
    DeviceType = pytest.importorskip("torch.autograd").DeviceType
    cpu, gpu = DeviceType.CPU, DeviceType.CUDA
    events = [
        FakeEvent("sonicmoe::_up_projection_forward", cpu, 10, 0, 1, 0, 1000, [[32768, 2048]]),
        FakeEvent("quack::gemm_gated", cpu, 11, 0, 1, 100, 900),
        FakeEvent("cudaLaunchKernelExC", cpu, 500, 11, 1, 200, 210),  # runtime call: not an op
        FakeEvent("sonicmoe::_down_projection_forward", cpu, 12, 0, 1, 1000, 2000),
        FakeEvent("gemm_b", gpu, 501, 12, 0, 9000, 9500),
        FakeEvent("gemm_a", gpu, 500, 11, 0, 5000, 8000),
        FakeEvent("orphan", gpu, 502, 0, 0, 9600, 9700),
    ]
    recs = records_from(FakeProfile(events), "forward", 2)
    assert [r["name"] for r in recs] == ["gemm_a", "gemm_b", "orphan"]
    assert recs[0]["ops"] == ["quack::gemm_gated", "sonicmoe::_up_projection_forward"]
    assert recs[0]["us"] == 3.0 and recs[0]["phase"] == "forward" and recs[0]["step"] == 2
    assert recs[1]["ops"] == ["sonicmoe::_down_projection_forward"]
    assert recs[2]["ops"] == []
