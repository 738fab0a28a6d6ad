"""CPU tests of bench/report.py: moeblaze's ratio to each peer and to the best other baseline,
rows of a peer that did not run, and merging runs."""
import json

import report


def row(impl, step, shape="qwen3-30b-a3b", routing="random", T=32768, **kw):
    r = {"shape": shape, "impl": impl, "routing": routing, "tokens": T, "fwd_ms": step / 3, "step_ms": step,
         "step_spread_ms": 0.1, "tflops": 18 * T * 8 * 2048 * 768 / step / 1e9, "act_mib": 800.0, "peak_mib": 2000.0,
         "peak_alloc_mib": 1900.0, "routing_path": "caller routing"}
    r.update(kw)
    return r


def err(impl, why, shape="qwen3-30b-a3b", routing="random", T=32768):
    return {"shape": shape, "impl": impl, "routing": routing, "tokens": T, "error": why}


def res_of(rows):
    return {"date": "2026-12-01T10:00:00", "device": "NVIDIA H200", "torch": "2.11", "commit": "abc123",
            "ceilings": {"gemm_tflops": 800.0, "copy_tbps": 4.2}, "results": rows, "kernels": {}}


def test_ratios_are_baseline_over_moeblaze():
    s = report.summarize([row("moeblaze", 10.0), row("moeblaze-recompute", 12.0), row("sonicmoe", 13.7),
                          row("megablocks", 21.8), row("torch-grouped_mm", 27.6), row("torch-loop", 250.0)])
    assert abs(s["vs_sonicmoe"] - 1.37) < 1e-12
    assert abs(s["vs_megablocks"] - 2.18) < 1e-12
    assert s["best_other"] == "torch-grouped_mm" and abs(s["vs_best_other"] - 2.76) < 1e-12
    assert abs(s["recompute_over_save_h"] - 1.2) < 1e-12
    assert s["moeblaze_step_ms"] == 10.0 and s["errors"] == {}


def test_peers_are_never_the_best_other_baseline():
    s = report.summarize([row("moeblaze", 10.0), row("sonicmoe", 5.0), row("torch-loop", 40.0)])
    assert s["best_other"] == "torch-loop" and s["vs_best_other"] == 4.0


def test_a_peer_that_did_not_run_has_no_ratio_and_says_why(tmp_path):
    rows = [row("moeblaze", 10.0), err("sonicmoe", "unavailable: peer folder .peers/sonicmoe not found"),
            row("megablocks", 15.0)]
    s = report.summarize(rows)
    assert s["vs_sonicmoe"] is None and s["vs_megablocks"] == 1.5
    assert s["errors"] == {"sonicmoe": "unavailable: peer folder .peers/sonicmoe not found"}
    report.write_table(res_of(rows), tmp_path / "t.md")
    md = (tmp_path / "t.md").read_text()
    assert "| qwen3-30b-a3b | random | 32768 | 10.00 |" in md
    assert "| n/a | 1.50x | - | - |" in md
    assert "- sonicmoe: unavailable: peer folder .peers/sonicmoe not found" in md
    assert "above 1 moeblaze is faster" in md
    assert "commit abc123" in md


def test_a_failed_moeblaze_row_gives_no_ratios():
    s = report.summarize([err("moeblaze", "failed: RuntimeError: x"), row("sonicmoe", 13.0)])
    assert s["moeblaze_step_ms"] is None and s["vs_sonicmoe"] is None


def test_write_outputs_keeps_the_summary_in_the_json(tmp_path):
    rows = [row("moeblaze", 10.0), row("sonicmoe", 11.0), row("moeblaze", 20.0, routing="skewed"),
            row("sonicmoe", 25.0, routing="skewed", routing_path="caller routing (moe_general_routing_inputs)")]
    report.write_outputs(res_of(rows), tmp_path)
    data = json.loads((tmp_path / "results.json").read_text())
    assert [round(s["vs_sonicmoe"], 6) for s in data["summary"]] == [1.1, 1.25]
    md = (tmp_path / "table.md").read_text()
    assert "- sonicmoe, skewed: caller routing (moe_general_routing_inputs)" in md
    assert md.count("| sonicmoe |") == 2  # the every-implementation table


def test_merge_takes_the_later_row_and_every_peer_entry(tmp_path):
    a = res_of([row("moeblaze", 10.0), row("sonicmoe", 11.0)])
    a["peers"] = {"sonicmoe": {"ok": True}}
    b = res_of([row("sonicmoe", 12.0)])
    b["peers"] = {"megablocks": {"ok": False, "reason": "x"}}
    fa, fb = tmp_path / "a.json", tmp_path / "b.json"
    fa.write_text(json.dumps(a))
    fb.write_text(json.dumps(b))
    m = report.merge([fa, fb])
    assert {r["impl"]: r["step_ms"] for r in m["results"]} == {"moeblaze": 10.0, "sonicmoe": 12.0}
    assert set(m["peers"]) == {"sonicmoe", "megablocks"}


def test_every_implementation_keeps_its_colour_whichever_others_ran():
    assert report.colour("moeblaze") == "#d62728" and report.colour("sonicmoe") == "#2ca02c"
    assert len({report.colour(i) for i in report.PLOT_ORDER}) == len(report.PLOT_ORDER)
    # An implementation no table lists gets a colour from its name: the same in every run.
    assert report.colour("new-peer") == report.colour("new-peer") in report.OTHER_COLOURS


def test_the_example_plot_uses_the_same_colours():
    import ast
    from pathlib import Path
    src = (Path(report.__file__).resolve().parent.parent / "examples" / "train_moe.py").read_text()
    assign = next(n for n in ast.parse(src).body if isinstance(n, ast.Assign)
                  and getattr(n.targets[0], "id", None) == "COLOURS")
    example = ast.literal_eval(assign.value)
    assert example == {"moeblaze": report.colour("moeblaze"), "grouped_mm": report.colour("torch-grouped_mm"),
                       "eager": report.colour("torch-loop")}


def test_the_plot_colours_bars_by_implementation_and_names_its_axis(tmp_path):
    import pytest
    pytest.importorskip("matplotlib")
    T = report.suite_tokens("qwen3-30b-a3b")
    one = res_of([row("moeblaze", 10.0, T=T), row("sonicmoe", 9.0, T=T), row("torch-grouped_mm", 20.0, T=T)])
    two = res_of([row("sonicmoe", 9.0, T=T), row("moeblaze", 10.0, T=T)])
    c1 = report.write_plot(one, tmp_path / "one.png")
    c2 = report.write_plot(two, tmp_path / "two.png")
    assert c1["sonicmoe"] == c2["sonicmoe"] == "#2ca02c" and c1["moeblaze"] == c2["moeblaze"]
    assert list(c1) == ["moeblaze", "sonicmoe", "torch-grouped_mm"]
    assert (tmp_path / "one.png").stat().st_size > 0
    assert "18TKdn" not in report.Y_LABEL and "TFLOP/s" in report.Y_LABEL


def test_the_plot_takes_held_out_shapes_at_their_own_tokens(tmp_path):
    import pytest
    pytest.importorskip("matplotlib")
    ho = report.HELDOUT[0]
    rows = [row("moeblaze", 10.0, shape=ho["name"], T=ho["T"]), row("sonicmoe", 9.0, shape=ho["name"], T=ho["T"]),
            row("moeblaze", 12.0, shape="not-a-listed-shape", T=4096)]
    colours = report.write_plot(res_of(rows), tmp_path / "ho.png")
    assert list(colours) == ["moeblaze", "sonicmoe"] and (tmp_path / "ho.png").stat().st_size > 0
    assert report.suite_tokens("not-a-listed-shape") is None
