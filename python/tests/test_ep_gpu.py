"""Expert parallelism with moeblaze's kernels on ONE GPU (skipped without CUDA):

- EP = 1 over NCCL (a one-rank group: every exchange call runs) against plain
  moeblaze.torch.moe on the same batch: within bf16 tolerance (not bitwise: EP rounds each
  slot's g*o and dx row to bf16 before the (token, k) sum, the plain layer sums in float32);
  1 and 2 chunks bitwise equal; the plain-PyTorch expert compute within tolerance;
- EP = 2 in two processes on the same GPU with gloo for the exchange (staged through host
  memory; NCCL refuses two ranks on one GPU) against EP = 1 bit for bit: y, dx, the gate
  gradient, every weight gradient, for 1 and 2 chunks, random and skewed routing, a rank
  without tokens, save-h and recompute;
- one rank's bad layout, expert id or argument (ep_launch.FAULTS) raises on both ranks, and
  the group works afterwards.

A fresh kernel cache (MOEBLAZE_CACHE) holds no tuned tiles, so every run uses the default
tiles, whose results do not depend on the local expert count (docs/expert-parallelism.md, Numerics)."""
import os
import sys

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ep_launch import FAULTS, bitwise_equal, check_fault_raised_everywhere, launch, rel  # noqa: E402

KEYS = ("y", "dx", "dgates", "dw1", "dw3", "dw2")
CASE = dict(mode="ep", engine="moeblaze", dtype="bfloat16", gate_dtype="float32", activation="swiglu", E=8, K=2,
            d=256, n=128, chunks=[1, 2], seed=11)


@pytest.fixture(scope="module")
def cache_env(tmp_path_factory):
    return {"MOEBLAZE_CACHE": str(tmp_path_factory.mktemp("cache") / "kernels.db")}


def assert_close_to(got, want, tol=1e-2):
    for k in KEYS:
        assert rel(got[k], want[k]) < tol, (k, rel(got[k], want[k]))
        assert want[k].float().abs().sum() > 0, k


def test_ep1_over_nccl_matches_plain_moe(tmp_path, cache_env):
    cases = [dict(CASE, T=[777], plain=True), dict(CASE, T=[777], engine="torch", chunks=[1])]
    res = launch(cases, 1, tmp_path, backend="nccl", device="cuda:0", env=cache_env)[0]
    ep, ref_engine = res[0], res[1]
    for k in KEYS:
        assert bitwise_equal(ep["ep1_c1"][k], ep["ep1_c2"][k]), ("chunks change bits", k)
        # the world group (one rank) and a one-rank subgroup: the same call
        assert bitwise_equal(ep["ep1_c1"][k], ep["world_c1"][k]), ("world group", k)
    assert_close_to(ep["ep1_c1"], ep["plain"])
    assert_close_to(ep["ep1_c1"], ref_engine["ep1_c1"])
    assert int(ep["ep1_c1"]["counts"].sum()) == 777 * 2


def test_ep2_on_one_gpu_equals_ep1_bitwise(tmp_path, cache_env):
    cases = [dict(CASE, T=[300, 212], plain=True),
             dict(CASE, T=[256, 0], pick_experts=3, checkpoint="recompute", seed=12)]
    res = launch(cases, 2, tmp_path, backend="gloo", device="cuda:0", env=cache_env)
    for i, case in enumerate(cases):
        for chunks in case["chunks"]:
            ep1 = res[0][i][f"ep1_c{chunks}"]
            for k in KEYS:
                got = torch.cat([res[r][i][f"world_c{chunks}"][k] for r in range(2)])
                assert bitwise_equal(got, ep1[k]), (i, chunks, k)
                assert bitwise_equal(ep1[k], res[0][i]["ep1_c1"][k]), (i, "chunks change bits", chunks, k)
    assert_close_to(res[0][0]["ep1_c1"], res[0][0]["plain"])


def test_one_ranks_bad_input_raises_on_every_rank(tmp_path, cache_env):
    case = dict(CASE, mode="faults", T=[300, 212], chunks=[1], faults=FAULTS)
    res = launch([case], 2, tmp_path, backend="gloo", device="cuda:0", env=cache_env, timeout_s=400, pg_timeout_s=120)
    for f in FAULTS:
        check_fault_raised_everywhere(res, f["name"])
    for r in range(2):
        after = res[r][0]["after"]
        assert after["raised"] is None, after
        assert torch.isfinite(after["y"].float()).all() and after["y"].float().abs().sum() > 0


@pytest.mark.parametrize("K,d,dtype", [(8, 7168, torch.bfloat16), (1, 256, torch.bfloat16), (3, 200, torch.float32)])
def test_gather_sum_kernel_gives_the_pytorch_bits(K, d, dtype):
    from moeblaze import _gather_sum_kernel
    from moeblaze._dispatch import gather_sum
    if not _gather_sum_kernel.available(torch.empty(1, 1, device="cuda", dtype=dtype)):
        pytest.skip("no Triton")
    torch.manual_seed(K)
    T = 1000
    rows = torch.randn(T * K + 17, d, device="cuda").to(dtype)
    rows[::7, ::3] = -0.0  # a sum that starts at -0.0 must stay -0.0
    position = torch.randperm(T * K + 17, device="cuda")[:T * K].view(T, K)
    got = gather_sum(rows, position, dtype)
    want = gather_sum(rows, position, dtype, kernel=False)
    assert bitwise_equal(got, want)
    assert got.float().abs().sum() > 0
