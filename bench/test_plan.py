"""CPU tests of bench/plan.py and suite.py's options: which cases run in which order, the
--quick subset, and the time estimate behind run_suite.sh's ~8 minutes."""
import pytest

import plan
import suite

ALL = [s["name"] for s in plan.SUITE]


def test_random_first_then_skewed_then_the_sweep():
    cs = plan.cases(ALL, ["random", "skewed"], ["moeblaze"], ["qwen3-30b-a3b"])
    kinds = [(c.routing, c.tokens == plan.SHAPES[c.shape]["T"]) for c in cs]
    assert kinds == [("random", True)] * 6 + [("skewed", True)] * 6 + [("random", False)] * 4
    assert [c.tokens for c in cs[12:]] == [4096, 8192, 16384, 65536]  # 32768 is qwen3's suite T


def test_torch_loop_stays_out_of_wide_expert_counts_and_the_sweep():
    cs = plan.cases(ALL, ["random"], ["torch-loop", "moeblaze"], ["deepseek-v3", "qwen3-30b-a3b"])
    loops = {c.shape for c in cs if c.impl == "torch-loop"}
    assert loops == {"mixtral-8x7b", "gpt-oss-20b", "olmoe-1b-7b", "qwen3-30b-a3b"}
    assert all(c.tokens == plan.SHAPES[c.shape]["T"] for c in cs if c.impl == "torch-loop")
    assert any(c.tokens == 4096 and c.impl == "moeblaze" for c in cs)


def test_sweep_needs_the_shape_in_shapes():
    cs = plan.cases(["gpt-oss-20b"], ["random"], ["moeblaze"], ["qwen3-30b-a3b"])
    assert [c.shape for c in cs] == ["gpt-oss-20b"]


def test_parse_list_names_the_option_and_the_unknown():
    assert plan.parse_list("a,b", ["a", "b"], "--x") == ["a", "b"]
    with pytest.raises(ValueError, match=r"--impls: unknown \['scattermoe'\]"):
        plan.parse_list("moeblaze,scattermoe", plan.IMPLS, "--impls")
    with pytest.raises(ValueError, match="empty"):
        plan.parse_list(",", plan.IMPLS, "--impls")


def test_quick_defaults_and_overrides():
    a = suite.parse_args(["--quick"])
    assert a.shape_list == list(plan.QUICK["shapes"]) and a.impl_list == ["moeblaze", "sonicmoe"]
    assert a.routing_list == ["random"] and a.kernel_list == ["qwen3-30b-a3b"]
    a = suite.parse_args(["--quick", "--impls", "moeblaze,megablocks", "--kernels", "none"])
    assert a.impl_list == ["moeblaze", "megablocks"] and a.kernel_list == []
    a = suite.parse_args([])
    assert a.shape_list == ALL and a.impl_list == list(plan.IMPLS) and a.kernel_list == []
    assert "sonicmoe" in a.impl_list and "megablocks" in a.impl_list


@pytest.mark.parametrize("argv", [["--shapes", "nope"], ["--steps", "5"], ["--kernels", "x"], ["--deadline-s", "0"]])
def test_bad_options_exit_with_usage(argv, capsys):
    with pytest.raises(SystemExit) as e:
        suite.parse_args(argv)
    assert e.value.code == 2
    assert argv[0] in capsys.readouterr().err


def test_the_full_run_fits_its_deadline_and_quick_is_short():
    a = suite.parse_args(["--sweep", "--kernels", "qwen3-30b-a3b"])
    full = plan.cases(a.shape_list, a.routing_list, a.impl_list, a.sweep_shape_list, a.sweep_impl_list)
    est = plan.estimate_seconds(full, a.kernel_list)
    assert 300 < est["total"] < 500, est  # run_suite.sh cuts at 500 s; the device call allows 600
    assert {c.impl for c in full} == set(plan.IMPLS)
    q = suite.parse_args(["--quick"])
    quick = plan.cases(q.shape_list, q.routing_list, q.impl_list)
    assert plan.estimate_seconds(quick, q.kernel_list)["total"] < 150


def test_estimate_scales_with_tokens_and_counts_each_sonic_problem_once():
    c1 = plan.Case("qwen3-30b-a3b", "random", 32768, "moeblaze")
    c2 = plan.Case("qwen3-30b-a3b", "random", 65536, "moeblaze")
    assert plan.case_seconds(c2) > 1.9 * (plan.case_seconds(c1) - plan.CASE_OVERHEAD_S)
    s = [plan.Case("qwen3-30b-a3b", r, 32768, "sonicmoe") for r in ("random", "skewed")]
    assert plan.estimate_seconds(s)["peers"] == plan.PEER_FIRST_USE_S["sonicmoe"] + plan.SONIC_AUTOTUNE_S


def test_held_out_shapes_run_by_name_and_never_by_default():
    assert set(plan.HELDOUT).isdisjoint(plan.SHAPES)
    a = suite.parse_args(["--shapes", "qwen1.5-moe,mixtral-8x7b", "--impls", "moeblaze,sonicmoe", "--routing", "random",
                          "--kernels", "none", "--dry-run"])
    assert a.shape_list == ["qwen1.5-moe", "mixtral-8x7b"]
    cs = plan.cases(a.shape_list, ["random"], ["moeblaze", "sonicmoe"])
    assert {(c.shape, c.tokens) for c in cs} == {("qwen1.5-moe", 32768), ("mixtral-8x7b", 16384)}
    assert plan.case_seconds(cs[0]) > 0
    d = suite.parse_args(["--dry-run"])
    assert not set(d.shape_list) & set(plan.HELDOUT)


def test_held_out_shapes_take_one_router():
    pytest.importorskip("torch")  # impls.py builds the implementations with torch
    import impls
    assert impls.router_of("qwen1.5-moe") == impls.HELDOUT_ROUTER
    assert impls.router_of("deepseek-v3") == ("sigmoid", True, 2.5)


def test_held_out_shapes_reach_the_cli_by_their_dimensions():
    assert suite.shape_args("qwen3-30b-a3b") == ["--preset", "qwen3-30b-a3b"]
    assert suite.shape_args("qwen1.5-moe") == ["-E", "60", "-K", "4", "-d", "2048", "-n", "1408", "--router", "softmax",
                                               "--renormalize"]
