"""Expert parallelism over NCCL with one GPU per rank (skipped with fewer than two GPUs; run on
nvidia-h200-x2 with NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1):

- EP = 2 == EP = 1 (rank 0 alone, the batches concatenated) bit for bit, 1 and 2 chunks;
- FSDP2 on the dp dimension of a (dp=1, ep=2) mesh against EP = 1 without FSDP;
- the device-split exchange (exchange="symm_mem", NVSHMEM) against the NCCL path bit for
  bit, where torch has NVSHMEM;
- one rank's bad layout, expert id or argument (ep_launch.FAULTS) raises on both ranks over
  NCCL (whose collectives would otherwise wait 10 minutes), and the group works afterwards."""
import os
import sys

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
    pytest.skip("needs two CUDA GPUs", allow_module_level=True)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ep_launch import FAULTS, bitwise_equal, check_fault_raised_everywhere, launch, rel  # noqa: E402

KEYS = ("y", "dx", "dgates", "dw1", "dw3", "dw2")
CASE = dict(mode="ep", engine="moeblaze", dtype="bfloat16", gate_dtype="float32", activation="swiglu", E=16, K=4,
            d=512, n=256, chunks=[1, 2, 4], seed=21)
ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    return dict(ENV, MOEBLAZE_CACHE=str(tmp_path_factory.mktemp("cache") / "kernels.db"))


def test_ep2_nccl_equals_ep1_bitwise_and_fsdp(tmp_path, env):
    cases = [dict(CASE, T=[1024, 700], plain=True),
             dict(CASE, mode="fsdp", dp=1, ep=2, T=[512, 512], activation="swiglu", fsdp_chunks=2)]
    res = launch(cases, 2, tmp_path, backend="nccl", device="cuda:{rank}", env=env)
    for chunks in CASE["chunks"]:
        ep1 = res[0][0][f"ep1_c{chunks}"]
        for k in KEYS:
            got = torch.cat([res[r][0][f"world_c{chunks}"][k] for r in range(2)])
            assert bitwise_equal(got, ep1[k]), (chunks, k)
    for k in KEYS:
        assert rel(res[0][0]["ep1_c1"][k], res[0][0]["plain"][k]) < 1e-2, k
    ref = res[0][1]["ep1"]
    y = torch.cat([res[r][1]["fsdp"]["y"] for r in range(2)])
    assert rel(y, ref["y"]) < 1e-2
    for r in range(2):
        lo, hi = res[r][1]["fsdp"]["experts"].tolist()
        for k in ("dw1", "dw3", "dw2"):
            # FSDP divides by the 2 data-parallel ranks (dp x ep); the reference summed
            assert rel(res[r][1]["fsdp"][k].float() * 2, ref[k][lo:hi].float()) < 1e-2, (r, k)


def test_symm_mem_exchange_equals_nccl(tmp_path, env):
    import torch.distributed._symmetric_memory as symm_mem
    if not symm_mem.is_nvshmem_available():
        pytest.skip("torch without NVSHMEM")
    base = dict(CASE, T=[1024, 700], chunks=[1], solo=False)
    cases = [base, dict(base, exchange="symm_mem", max_tokens=1024)]
    res = launch(cases, 2, tmp_path, backend="nccl", device="cuda:{rank}", env=env)
    for r in range(2):
        for k in KEYS:
            assert bitwise_equal(res[r][1]["world_c1"][k], res[r][0]["world_c1"][k]), (r, k)


def test_one_ranks_bad_input_raises_on_every_rank_over_nccl(tmp_path, env):
    case = dict(CASE, mode="faults", T=[300, 212], chunks=[1], faults=FAULTS)
    res = launch([case], 2, tmp_path, backend="nccl", device="cuda:{rank}", env=env, timeout_s=400, pg_timeout_s=120)
    for f in FAULTS:
        check_fault_raised_everywhere(res, f["name"])
    for r in range(2):
        assert res[r][0]["after"]["raised"] is None, res[r][0]["after"]
