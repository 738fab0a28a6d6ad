"""CPU test of suite.py's orchestration with the GPU parts replaced: the order of the cases, where
the per-kernel comparison runs, the deadline, missing peers, and the files of a run."""
import json
import sys
import types

import pytest

torch = pytest.importorskip("torch")

import plan  # noqa: E402
import suite  # noqa: E402

STEP_MS = {"moeblaze": 10.0, "moeblaze-recompute": 12.0, "sonicmoe": 11.0, "megablocks": 15.0,
           "torch-grouped_mm": 20.0, "torch-loop": 90.0}


@pytest.fixture
def fake_gpu(monkeypatch, tmp_path):
    calls = []
    measure = types.ModuleType("measure")
    measure.ceilings = lambda: {"gemm_tflops": 800.0, "copy_tbps": 4.2}
    monkeypatch.setitem(sys.modules, "measure", measure)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "fake H200")
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)

    def run_case(case, steps, peers_root):
        calls.append(("case", case))
        row = {"shape": case.shape, "impl": case.impl, "routing": case.routing, "tokens": case.tokens}
        if case.impl in plan.PEER_IMPLS:
            import peers
            p = peers.load(case.impl, peers_root)
            if not p.ok:
                return dict(row, error=f"unavailable: {p.reason}")
        ms = STEP_MS[case.impl]
        return dict(row, fwd_ms=ms / 3, step_ms=ms, step_spread_ms=0.1, tflops=100.0, act_mib=1.0, peak_mib=2.0,
                    peak_alloc_mib=2.0, routing_path="test")

    monkeypatch.setattr(suite, "run_case", run_case)
    monkeypatch.setattr(suite, "kernel_breakdown", lambda name, T: calls.append(("breakdown", name)) or {"error": "x"})
    import kernels
    monkeypatch.setattr(kernels, "run", lambda names, out, **kw: calls.append(("kernels", tuple(names))))
    import peers
    peers._loaded.clear()
    monkeypatch.setenv("MOEBLAZE_PEERS", str(tmp_path / "no-peers"))
    yield calls
    peers._loaded.clear()


def test_a_run_writes_its_files_and_says_why_peers_are_missing(fake_gpu, tmp_path):
    out = tmp_path / "run"
    suite.main(["--shapes", "gpt-oss-20b,qwen3-30b-a3b", "--routing", "random,skewed", "--kernels", "qwen3-30b-a3b",
                "--out", str(out)])
    kinds = [c[0] if c[0] != "case" else (c[1].routing, c[1].impl) for c in fake_gpu]
    first_skewed = kinds.index(("skewed", "moeblaze"))
    assert kinds.index("kernels") < first_skewed  # the comparison follows the random cases
    assert kinds.count("breakdown") == 2 and kinds.index("breakdown") < kinds.index("kernels")
    assert sorted(p.name for p in out.iterdir() if p.suffix != ".png") == ["results.json", "table.md"]
    res = json.loads((out / "results.json").read_text())
    assert res["peers"]["sonicmoe"]["ok"] is False and "not found" in res["peers"]["sonicmoe"]["reason"]
    sonic_rows = [r for r in res["results"] if r["impl"] == "sonicmoe"]
    assert len(sonic_rows) == 4 and all(r["error"].startswith("unavailable: peer folder") for r in sonic_rows)
    assert all(s["vs_sonicmoe"] is None and s["vs_best_other"] == 2.0 for s in res["summary"])
    assert "- sonicmoe: unavailable: peer folder" in (out / "table.md").read_text()


def test_the_deadline_skips_the_last_cases_with_a_reason(fake_gpu, tmp_path, monkeypatch):
    clock = iter(range(0, 10 ** 6, 40))  # every look at the clock: 40 s later
    monkeypatch.setattr(suite.time, "monotonic", lambda: next(clock))
    suite.main(["--shapes", "gpt-oss-20b", "--impls", "moeblaze,torch-grouped_mm", "--routing", "random,skewed",
                "--no-breakdown", "--deadline-s", "100", "--out", str(tmp_path / "run")])
    res = json.loads((tmp_path / "run" / "results.json").read_text())
    skipped = [r for r in res["results"] if r.get("error") == "skipped: --deadline-s"]
    ran = [r for r in res["results"] if "error" not in r]
    assert ran and skipped and len(ran) + len(skipped) == 4
    assert res["results"].index(skipped[0]) > res["results"].index(ran[-1])


def test_dry_run_needs_no_gpu(capsys):
    suite.main(["--quick", "--dry-run"])
    out = capsys.readouterr().out
    assert "qwen3-30b-a3b" in out and "estimate on an H200" in out
