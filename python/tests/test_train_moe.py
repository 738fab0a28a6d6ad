"""examples/train_moe.py on the CPU: a tiny model trained with transformers' grouped_mm (the
baseline) and eager experts; the JSON holds each run's loss curve, tokens/s and (no GPU) no
peak memory, the curves agree and fall, moeblaze is refused without a GPU with the fix, and the
plot gives each implementation its fixed colour. Skipped without torch or transformers."""
import importlib.util
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_moe.py"
TINY = ["--steps", "40", "--batch", "2", "--seq", "32", "--hidden", "128", "--ffn", "64", "--layers", "1",
        "--num-experts", "8", "--top-k", "2", "--data-mb", "1", "--device", "cpu"]


def _example():
    spec = importlib.util.spec_from_file_location("train_moe", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_cpu_run_compares_grouped_mm_and_eager(tmp_path):
    ex = _example()
    assert ex.main(TINY + ["--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "train_moe.json").read_text())
    assert result["baseline"] == "grouped_mm" and result["device"] == "cpu"
    runs = {r["experts"]: r for r in result["runs"]}
    assert list(runs) == ["grouped_mm", "eager"]
    for r in runs.values():
        assert len(r["losses"]) == 40 and r["tokens_per_s"] > 0 and r["peak_mib"] is None
        first, last = sum(r["losses"][:ex.WINDOW]), sum(r["losses"][-ex.WINDOW:])
        assert last < 0.9 * first, r["losses"]
    cmp = result["comparisons"]["eager"]
    assert cmp["agree"] and cmp["max_window_gap"] <= 0.02 and cmp["peak_ratio"] is None


def test_moeblaze_without_a_gpu_says_what_to_run_instead(tmp_path):
    ex = _example()
    with pytest.raises(SystemExit, match="grouped_mm eager"):
        ex.main(TINY + ["--experts", "moeblaze", "grouped_mm", "--out", str(tmp_path)])


def test_each_implementation_keeps_its_colour(tmp_path):
    pytest.importorskip("matplotlib")
    ex = _example()
    assert set(ex.COLOURS) == set(ex.IMPLEMENTATIONS) and len(set(ex.COLOURS.values())) == len(ex.COLOURS)
    runs = [{"experts": e, "losses": [3.0, 2.0, 1.0], "tokens_per_s": 1e3, "peak_mib": None}
            for e in ("moeblaze", "eager")]
    fig = ex.plot(runs, tmp_path / "loss.png")
    assert (tmp_path / "loss.png").stat().st_size > 0
    import matplotlib.colors as mc
    got = [mc.to_hex(line.get_color()) for line in fig.axes[0].lines]
    assert got == [ex.COLOURS["moeblaze"], ex.COLOURS["eager"]]
