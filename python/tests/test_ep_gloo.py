"""Expert parallelism end to end on the CPU: two (or four) processes with the gloo backend run
the EP layer's forward and backward with the plain-PyTorch expert compute. Inputs are small
integers in float64, so every sum is exact: a misrouted or misordered row changes the bits,
and the comparisons below are bitwise.

- EP = 2 (1 and 2 chunks) == EP = 1 (the same code path on one rank over the concatenated
  batch) bit for bit: y, dx, the gate gradient, every weight gradient;
- EP = 1 == moeblaze.reference.moe (a different implementation: masks and index_add);
- uneven and empty batches, ranks and chunks that receive nothing;
- FSDP2 on the dp dimension of a (dp=2, ep=2) mesh against EP = 1 without FSDP."""
import os
import sys

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("needs torch.distributed with gloo", allow_module_level=True)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ep_launch import FAULTS, bitwise_equal, check_fault_raised_everywhere, launch, rel  # noqa: E402

from moeblaze.reference import moe as ref_moe  # noqa: E402

KEYS = ("y", "dx", "dgates", "dw1", "dw3", "dw2")


def check_ep_equals_ep1(res, cfg, world):
    E, local = cfg["E"], cfg["E"] // world
    for chunks in cfg["chunks"]:
        ep1 = res[0][f"ep1_c{chunks}"]
        for k in KEYS:
            if k not in ep1:
                continue
            # tokens and experts are both in rank order: concatenating the ranks' parts gives EP = 1's
            got = torch.cat([res[r][f"world_c{chunks}"][k] for r in range(world)])
            assert bitwise_equal(got, ep1[k]), (chunks, k)
            assert bitwise_equal(got, res[0][f"ep1_c{cfg['chunks'][0]}"][k]), ("chunk counts differ", chunks, k)
        counts = sum(res[r][f"world_c{chunks}"]["counts"].long() for r in range(world))
        assert counts.sum().item() == sum(cfg["T"]) * cfg["K"] and counts.shape == (E,)
    assert local * world == E


def reference(cfg):
    """moeblaze.reference.moe (float32 math: exact on these integers) on the whole batch."""
    from ep_worker import make_data
    data = make_data(cfg)
    leaves = {k: data[k].clone().requires_grad_() for k in ("x", "gates", "w1", "w3", "w2")}
    y = ref_moe(leaves["x"], data["ids"], leaves["gates"], leaves["w1"], leaves["w3"], leaves["w2"], act="relu")
    y.backward(data["dy"].float())
    out = dict(y=y.detach().double())
    for k, name in (("x", "dx"), ("gates", "dgates"), ("w1", "dw1"), ("w3", "dw3"), ("w2", "dw2")):
        out[name] = leaves[k].grad
    return out


BASE = dict(mode="ep", engine="torch", dtype="float64", integer=True, activation="relu", E=8, K=3, d=16, n=8,
            chunks=[1, 2], seed=1)
CASES = {
    "uneven": dict(T=[12, 7]),
    "empty-rank": dict(T=[9, 0], seed=2),                   # a rank without tokens
    "skewed": dict(T=[10, 6], pick_experts=3, seed=3),      # rank 1's experts, rank 0's 2nd chunk: nothing
    "top1": dict(T=[8, 8], K=1, E=4, chunks=[1, 2], seed=4),
}
FOUR = {
    "ep4": dict(BASE, T=[5, 7, 0, 4], chunks=[1, 2], seed=6),
    "fsdp": dict(BASE, mode="fsdp", dp=2, ep=2, T=[5, 7, 6, 4], fsdp_chunks=2, seed=5),
}


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """Every two-rank case in one launch (starting the processes is the slow part)."""
    names = list(CASES)
    res = launch([dict(BASE, **CASES[n]) for n in names], 2, tmp_path_factory.mktemp("ep2"))
    return {n: [r[i] for r in res] for i, n in enumerate(names)}


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory):
    names = list(FOUR)
    res = launch([FOUR[n] for n in names], 4, tmp_path_factory.mktemp("ep4"))
    return {n: [r[i] for r in res] for i, n in enumerate(names)}


@pytest.mark.parametrize("name", list(CASES))
def test_ep2_equals_ep1_bitwise(name, two_ranks):
    cfg = dict(BASE, **CASES[name])
    res = two_ranks[name]
    check_ep_equals_ep1(res, cfg, 2)
    ref = reference(cfg)
    ep1 = res[0]["ep1_c1"]
    for k in KEYS:
        assert torch.equal(ep1[k], ref[k].double()), k
        assert ep1[k].abs().sum() > 0, ("all zeros", k)


def test_ep4_equals_ep1_bitwise(four_ranks):
    cfg = FOUR["ep4"]
    check_ep_equals_ep1(four_ranks["ep4"], cfg, 4)
    ref = reference(cfg)
    for k in KEYS:
        assert torch.equal(four_ranks["ep4"][0]["ep1_c1"][k], ref[k].double()), k


def test_fsdp2_on_dp_with_ep(four_ranks):
    res = four_ranks["fsdp"]
    ref = res[0]["ep1"]
    world = 4
    y = torch.cat([res[r]["fsdp"]["y"] for r in range(world)])
    dx = torch.cat([res[r]["fsdp"]["dx"] for r in range(world)])
    # the router (moeblaze.reference.route) runs in float32: a tolerance instead of bits
    assert rel(y, ref["y"]) < 1e-6 and rel(dx, ref["dx"]) < 1e-6
    # FSDP averages over the 4 data-parallel ranks; the reference summed over the whole batch
    for r in range(world):
        assert rel(res[r]["fsdp"]["gate"] * world, ref["gate"]) < 1e-6
        lo, hi = res[r]["fsdp"]["experts"].tolist()
        for k in ("dw1", "dw3", "dw2"):
            if k in ref:
                assert rel(res[r]["fsdp"][k] * world, ref[k][lo:hi]) < 1e-6, (r, k)
                assert res[r]["fsdp"][k].abs().sum() > 0


# One rank's bad input, two ranks over gloo (ep_launch.FAULTS): every rank raises at the same
# call, and a healthy call afterwards works.
@pytest.fixture(scope="module")
def faults(tmp_path_factory):
    case = dict(BASE, mode="faults", T=[6, 5], chunks=[1], faults=FAULTS)
    return launch([case], 2, tmp_path_factory.mktemp("faults"), timeout_s=300, pg_timeout_s=60)


@pytest.mark.parametrize("name", [f["name"] for f in FAULTS])
def test_one_ranks_bad_input_raises_on_every_rank(name, faults):
    check_fault_raised_everywhere(faults, name)


def test_the_group_works_after_the_faults(faults):
    ref = reference(dict(BASE, T=[6, 5]))
    y = torch.cat([faults[r][0]["after"]["y"] for r in range(2)])
    dx = torch.cat([faults[r][0]["after"]["dx"] for r in range(2)])
    assert faults[0][0]["after"]["raised"] is None and faults[1][0]["after"]["raised"] is None
    assert torch.equal(y, ref["y"].double()) and torch.equal(dx, ref["dx"].double())
