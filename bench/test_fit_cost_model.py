"""The cost-model fit's pure-Python parts: non-negative least squares, the rows it gathers from
results files, and its refusals. (CTest `cost_model_fit` runs it end to end against the binary.)"""
import json
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import fit_cost_model as fcm  # noqa: E402


def test_nnls_recovers_non_negative_coefficients():
    true = [2.0, 0.0, 0.5]
    xs = [[1.0, (i * 7) % 5, (i * 3) % 11 + 1] for i in range(40)]
    ys = [sum(a * b for a, b in zip(true, x)) for x in xs]
    p = fcm.nnls(xs, ys)
    assert p == pytest.approx(true, abs=1e-6)


def test_nnls_clamps_what_would_be_negative():
    # y = 5 - x: the unconstrained slope is -1; non-negative, it is 0 and the intercept the mean.
    xs = [[1.0, float(i)] for i in range(5)]
    ys = [5.0 - i for i in range(5)]
    p = fcm.nnls(xs, ys)
    assert p[1] == 0.0
    assert p[0] == pytest.approx(sum(ys) / len(ys))


def _results(tmp_path, device, kernels):
    doc = {"device": device, "kernels": {"qwen3-30b-a3b": {
        "layer": "E=128 K=8 d=2048 n=768 swiglu router=softmax,renorm", "tokens": 32768, "device": device,
        "kernels": kernels}}}
    path = tmp_path / f"{device.split()[1]}.json"
    path.write_text(json.dumps(doc))
    return str(path)


def test_rows_take_the_median_per_device_shape_family_and_tile(tmp_path):
    a = _results(tmp_path, "NVIDIA H200", [{"family": "down_proj", "tile": "t1", "ms": 1.0},
                                           {"family": "up_proj", "tile": "t2", "ms": 2.0},  # older name
                                           {"family": "router_logits", "tile": "t3", "ms": 0.1}])
    b = _results(tmp_path, "NVIDIA H100 80GB HBM3", [{"family": "down_proj", "tile": "t1", "ms": 1.4}])
    rows = fcm.collect_rows([a, b, a])
    by = {(r["device"], r["family"]): r for r in rows}
    assert set(by) == {("h200", "down_proj"), ("h200", "gate_up"), ("h100", "down_proj")}
    assert by[("h200", "down_proj")]["ms"] == 1.0
    assert by[("h100", "down_proj")]["ms"] == 1.4
    assert by[("h200", "down_proj")]["E"] == 128 and by[("h200", "down_proj")]["T"] == 32768


def test_order_agreement_counts_pairs_apart_by_more_than_three_percent():
    def row(ms, mainloop):
        return {"device": "h100", "E": 1, "K": 1, "d": 8, "n": 8, "T": 1, "family": "down_proj", "ms": ms,
                "terms": {"tile_class": 1, "dram_us": 0, "mainloop_us": mainloop, "tiles": 0, "output_kib": 0}}
    rows = [row(1.0, 10), row(2.0, 20), row(1.01, 30), row(1.5, 10)]
    params = [0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0]
    pairs, agree, ties = fcm.order_agreement(rows, params)
    assert ties == 1  # 1.0 and 1.5 ms, both predicted 10
    assert pairs == 4  # 1.0 / 1.01 are within 3%
    # right: 1.0 < 2.0 (10 < 20), 1.5 < 2.0 (10 < 20), 1.5 > 1.01 (10 < 30: wrong), 2.0 > 1.01 (20 < 30: wrong)
    assert agree == 2


def test_bad_input_is_named(tmp_path, capsys):
    with pytest.raises(SystemExit):
        fcm.main(["--moeblaze", str(tmp_path / "none")])
    assert "--moeblaze" in capsys.readouterr().err
    fake = tmp_path / "moeblaze"
    fake.write_text("#!/bin/sh\nexit 1\n")
    with pytest.raises(SystemExit):
        fcm.main(["--moeblaze", str(fake), "--results", str(tmp_path / "missing")])
    assert "--results" in capsys.readouterr().err
    bad = tmp_path / "results.json"
    bad.write_text("{not json")
    with pytest.raises(SystemExit) as e:
        fcm.main(["--moeblaze", str(fake), "--results", str(bad)])
    assert "--results" in str(e.value)


def test_the_fitted_runs_are_committed_results():
    runs = fcm.fitted_runs()
    assert len(runs) >= 10
    for r in runs:
        assert (pathlib.Path(r) / "results.json").is_file(), r


def test_a_malformed_layer_is_named(tmp_path):
    bad = tmp_path / "results.json"
    bad.write_text(json.dumps({"kernels": {"x": {"layer": "E=8 K=2", "tokens": 64, "kernels": []}}}))
    with pytest.raises(SystemExit) as e:
        fcm.collect_rows([str(bad)])
    assert "--results" in str(e.value) and "E=8 K=2" in str(e.value)
