"""CPU checks of bench/heldout.py: the commands it runs, the tables and targets it renders from the
reports, and the CLI's --family that its exhaustive search needs."""
import json
import subprocess

import pytest

import heldout
from suite import moeblaze_cli


def tune_report(default_ms, tuned_ms, fams, wall=100.0, compile_s=40.0):
    return {"step_default_ms": default_ms, "step_tuned_ms": tuned_ms, "wall_s": wall, "compile_seconds": compile_s,
            "device": "NVIDIA H200", "families": [
                {"family": f, "winner": w, "winner_ms": wm, "default": d, "default_ms": dm, "candidates": n}
                for f, (w, wm, d, dm, n) in fams.items()]}


def results_of(shapes):
    return {"meta": {"date": "2026-12-07T10:00:00", "budget": 120, "candidates": 12, "widen": 1, "device": "NVIDIA H200"},
            "shapes": shapes,
            "suite": {"results": [
                {"shape": "qwen1.5-moe", "impl": "moeblaze", "routing": "random", "step_ms": 11.0},
                {"shape": "qwen1.5-moe", "impl": "sonicmoe", "routing": "random", "step_ms": 12.1},
                {"shape": "phi-3.5-moe", "impl": "moeblaze", "routing": "random", "step_ms": 25.0},
                {"shape": "phi-3.5-moe", "impl": "sonicmoe", "routing": "random", "step_ms": 24.0}]}}


def test_dry_run_prints_every_tune_and_search_then_the_suite(capsys):
    assert heldout.main(["--out", "/tmp/ho-dry", "--shapes", "qwen1.5-moe,kimi-k2", "--exhaustive", "down_proj",
                         "--dry-run", "--moeblaze", "mb"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 5
    assert lines[0].startswith("mb tune -E 60 -K 4 -d 2048 -n 1408 -T 32768 --router softmax --renormalize")
    assert "--db /tmp/ho-dry/tuned.db" in lines[0] and "--widen 1" in lines[0] and "--family" not in lines[0]
    assert "--family down_proj --candidates 1000" in lines[1] and "/tmp/ho-dry/exhaustive.db" in lines[1]
    assert lines[2].startswith("mb tune -E 384 -K 8 -d 7168")
    assert lines[4].startswith("MOEBLAZE_CACHE=/tmp/ho-dry/tuned.db ") and "--shapes qwen1.5-moe,kimi-k2" in lines[4]


def test_unknown_shapes_are_refused_by_name():
    with pytest.raises(SystemExit):
        heldout.main(["--out", "/tmp/ho-x", "--shapes", "mixtral-8x7b", "--dry-run"])


def test_the_tables_and_targets_follow_the_reports():
    shapes = {
        "qwen1.5-moe": {"tune": tune_report(12.0, 11.4, {"down_proj": ("a", 1.0, "d", 1.05, 12)}),
                        "exhaustive": {"down_proj": tune_report(12.0, 11.9, {"down_proj": ("b", 0.98, "d", 1.05, 140)})}},
        "phi-3.5-moe": {"tune": tune_report(25.0, 25.0, {}, wall=200.0),
                        "exhaustive": {"down_proj": {"error": "timed out after 300 s", "wall_s": 300}}},
    }
    s = heldout.summarize(results_of(shapes))
    q = next(r for r in s["shapes"] if r["shape"] == "qwen1.5-moe")
    assert q["tuned_gain"] == pytest.approx(12.0 / 11.4) and q["vs_sonicmoe"] == pytest.approx(12.1 / 11.0)
    f = next(r for r in s["families"] if r["shape"] == "qwen1.5-moe")
    assert f["default_over_best"] == pytest.approx(1.05 / 0.98) and f["tuned_ms"] == 1.0 and f["timed"] == 140
    assert s["min_tuned_gain"] == pytest.approx(1.0)
    t = heldout.table(results_of(shapes))
    assert "| qwen1.5-moe | many-narrow | 100 (40) | 12.000 | 11.400 | 1.053x |" in t
    assert "timed out after 300 s" in t
    assert "default within 3% of the exhaustive best in every family sampled: not met (worst 1.071x)" in t
    assert "tuning at least 3% faster on average and never slower: not met" in t
    assert "tuned step ahead of SonicMoE on every shape: not met (worst 0.960x)" in t
    assert "a tune within 180 s: not met (longest 200 s)" in t


def test_table_only_renders_a_saved_run(tmp_path):
    res = tmp_path / "results.json"
    res.write_text(json.dumps(results_of({"qwen1.5-moe": {"tune": tune_report(12.0, 11.0, {}), "exhaustive": {}}})))
    assert heldout.main(["--out", str(tmp_path / "t"), "--table-only", str(res)]) == 0
    assert "| qwen1.5-moe |" in (tmp_path / "t" / "table.md").read_text()


def test_the_cli_names_a_family_it_cannot_tune():
    cli = moeblaze_cli()
    if not cli.exists():
        pytest.skip("no moeblaze CLI built")
    for fam, why in (("not_a_family", "is not a kernel family"), ("router_topk", "is not a tiled kernel family")):
        p = subprocess.run([str(cli), "tune", "-E", "8", "-K", "2", "-d", "64", "-n", "64", "-T", "100", "--family", fam,
                            "--db", "/nonexistent-dir/k.db"], capture_output=True, text=True)
        assert p.returncode == 2, p.stderr
        assert "--family" in p.stderr and why in p.stderr


def test_parts_leave_out_what_is_not_named(capsys):
    assert heldout.main(["--out", "/tmp/ho-dry", "--shapes", "qwen1.5-moe", "--exhaustive", "down_proj,gate_up",
                         "--parts", "exhaustive", "--dry-run", "--moeblaze", "mb"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all("--family" in x for x in lines)
    with pytest.raises(SystemExit):
        heldout.main(["--out", "/tmp/ho-dry", "--parts", "tune,bogus", "--dry-run"])


def test_a_missing_seed_is_refused_by_name(tmp_path, capsys):
    with pytest.raises(SystemExit):
        heldout.main(["--out", str(tmp_path / "o"), "--exhaustive-seed", str(tmp_path / "none.db"), "--dry-run"])
    assert "--exhaustive-seed" in capsys.readouterr().err


def test_table_only_merges_the_calls_of_one_table(tmp_path):
    first = results_of({"qwen1.5-moe": {"tune": tune_report(12.0, 11.4, {"down_proj": ("a", 1.0, "d", 1.05, 12)}),
                                        "exhaustive": {}}})
    second = {"meta": {"date": "2026-12-07T11:00:00", "device": "NVIDIA H200"}, "suite": {"results": []},
              "shapes": {"qwen1.5-moe": {"exhaustive": {
                  "down_proj": tune_report(12.0, 11.9, {"down_proj": ("b", 0.98, "d", 1.05, 140)})}}}}
    paths = []
    for i, r in enumerate((first, second)):
        paths.append(tmp_path / f"r{i}.json")
        paths[-1].write_text(json.dumps(r))
    assert heldout.main(["--out", str(tmp_path / "t"), "--table-only", *map(str, paths)]) == 0
    merged = json.loads((tmp_path / "t" / "results.json").read_text())
    q = merged["shapes"]["qwen1.5-moe"]
    assert q["tune"]["step_tuned_ms"] == 11.4 and q["exhaustive"]["down_proj"]["families"][0]["winner"] == "b"
    assert len(merged["suite"]["results"]) == 4 and merged["meta"]["budget"] == 120
    t = (tmp_path / "t" / "table.md").read_text()
    assert "| qwen1.5-moe | down_proj | d | 1.050 | a | 1.000 | b | 0.980 | 140 | 1.071x |" in t


def test_the_suite_alone_needs_an_earlier_tune(tmp_path, capsys):
    with pytest.raises(SystemExit):
        heldout.main(["--out", str(tmp_path), "--parts", "suite", "--shapes", "qwen1.5-moe"])
    assert "tuned.db" in capsys.readouterr().err


def test_a_failing_cli_reports_its_message_as_the_error(tmp_path):
    # `moeblaze tune --json` prints {"error": {"kind", "message", "exit_code"}} when it fails; the
    # table shows the message (a dict there crashed the table).
    fake = tmp_path / "fake-cli"
    fake.write_text("#!/bin/sh\necho '{\"error\": {\"exit_code\": 1, \"kind\": \"failure\", \"message\": \"gate_up_wgrad "
                    "candidate X faulted the GPU\"}}'\nexit 1\n")
    fake.chmod(0o755)
    rep = heldout.run_json([str(fake)], 10)
    assert rep["error"] == "gate_up_wgrad candidate X faulted the GPU"
    shapes = {"qwen1.5-moe": {"tune": rep, "exhaustive": {}}}
    assert "error: gate_up_wgrad candidate X faulted the GPU" in heldout.table(results_of(shapes))


def test_a_tune_that_kept_every_default_gains_exactly_one():
    kept = tune_report(24.83, 25.05, {"down_proj": ("d", 2.6, "d", 2.6, 12), "gate_up": ("g", 5.0, "g", 5.0, 12)})
    s = heldout.summarize(results_of({"phi-3.5-moe": {"tune": kept, "exhaustive": {}}}))
    assert s["shapes"][0]["tuned_gain"] == 1.0 and s["shapes"][0]["same_kernels"]
    assert "1.000x (defaults kept)" in heldout.table(results_of({"phi-3.5-moe": {"tune": kept, "exhaustive": {}}}))
    moved = tune_report(24.83, 24.0, {"down_proj": ("b", 2.5, "d", 2.6, 12)})
    assert heldout.summarize(results_of({"phi-3.5-moe": {"tune": moved, "exhaustive": {}}}))["shapes"][0]["tuned_gain"] == \
        pytest.approx(24.83 / 24.0)
