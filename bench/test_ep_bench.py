"""bench/ep.py on the CPU: torchrun with two ranks, gloo, a small shape and the plain-PyTorch
expert compute (--device cpu). Checks the bench's own bookkeeping (the byte count, the
derived columns, the table), not timings."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
HERE = Path(__file__).resolve().parent


def test_two_rank_cpu_run_reports_every_column(tmp_path):
    out = tmp_path / "ep.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE.parent / "python"), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(HERE / "ep.py"),
           "--device", "cpu", "--shape", "8,2,32,16", "--tokens", "48", "--chunks", "2", "--steps", "2",
           "--warmup", "1", "--json", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    r = json.loads(out.read_text())
    assert (r["ep"], r["E"], r["K"], r["d"], r["T_per_gpu"]) == (2, 8, 2, 32, 48)
    # rank 0 sends the slots routed to experts 4..7 and returns the rows it got from rank 1:
    # (x and dy rows, a gate) out and (g*o and dx rows, a gate gradient) back per row
    row = 2 * 32 * 2 + 4
    assert r["bytes_sent"] > 0 and r["bytes_sent"] % row == 0
    assert 0 < r["rows_received"] <= 2 * 48 * 2
    for k in ("single_ms", "ep_c1_ms", "ep_c2_ms", "compute_c1_ms", "compute_c2_ms", "exchange_ms"):
        assert r[k] > 0, k
    assert abs(r["hidden_by_overlap_ms"] - (r["ep_c1_ms"] - r["ep_c2_ms"])) < 1e-9
    assert abs(r["ratio_to_single"] - r["ep_c2_ms"] / r["single_ms"]) < 1e-9
    assert "| EP step, 2 chunk(s) |" in p.stdout and "ratio EP / single" in p.stdout
