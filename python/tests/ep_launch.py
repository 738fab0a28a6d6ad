"""Starts ep_worker.py once per rank (separate processes: a process group per process, none
in the test process) and loads what each rank saved."""
import json
import os
import subprocess
import sys

import torch

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ep_worker.py")


def launch(cases, nprocs, tmp_path, timeout_s=600, env=None, **cfg):
    """Runs `cases` (a list of ep_worker case configs) on nprocs ranks; returns per rank the
    list of the cases' results."""
    cfg = dict(cfg, world=nprocs, cases=cases, init_file=str(tmp_path / "pg_init"), out_dir=str(tmp_path))
    penv = dict(os.environ, **(env or {}))
    procs = [subprocess.Popen([sys.executable, WORKER, json.dumps(cfg), str(r)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env=penv) for r in range(nprocs)]
    logs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise AssertionError(f"rank timed out after {timeout_s} s")
        logs.append(out)
    for r, p in enumerate(procs):
        assert p.returncode == 0, f"rank {r} exited with {p.returncode}:\n{logs[r][-6000:]}"
    return [torch.load(tmp_path / f"rank{r}.pt") for r in range(nprocs)]


def bitwise_equal(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(-1).view(torch.uint8) if a.numel() else a,
                                                                     b.view(-1).view(torch.uint8) if b.numel() else b)


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()
