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


# One rank's bad input (ep_worker.fault_call; "E" is the case's expert count), in this order:
# layout mismatches first, since the ranks compare layouts at the first call of each (a rank
# that changed its layout later would compare alone), then what every call's counts exchange
# carries.
FAULTS = [
    dict(name="num_experts", rank=1, kind="num_experts", value="2E"),
    dict(name="experts_local", rank=0, kind="experts_local"),
    dict(name="top_k", rank=1, kind="top_k"),
    dict(name="chunks", rank=1, kind="chunks", value=2),
    dict(name="x_dtype", rank=0, kind="x_dtype"),
    dict(name="bad_id_E", rank=1, kind="bad_id", value="E"),
    dict(name="bad_id_negative", rank=0, kind="bad_id", value=-1),
    dict(name="bad_id_int32_max", rank=1, kind="bad_id", value=2**31 - 1),
    dict(name="weights_shape", rank=1, kind="weights_shape"),
]
EXPECTED_ARGUMENT = {"num_experts": "num_experts", "experts_local": "w1", "top_k": "topk_ids", "chunks": "chunks",
                     "x_dtype": "x", "bad_id_E": "topk_ids", "bad_id_negative": "topk_ids", "bad_id_int32_max": "topk_ids",
                     "weights_shape": "topk_weights"}
LAYOUT_FAULTS = ("num_experts", "experts_local", "top_k", "chunks", "x_dtype")


def check_fault_raised_everywhere(results, name, case=0):
    """Every rank raised InvalidArgument naming the argument of fault `name`; a layout mismatch
    with every rank's value, another rank's fault naming that rank."""
    bad_rank = next(f["rank"] for f in FAULTS if f["name"] == name)
    for rank, res in enumerate(results):
        got = res[case][name]
        assert got["raised"] == "InvalidArgument", (rank, got)
        assert got["argument"] == EXPECTED_ARGUMENT[name], (rank, got)
        if name in LAYOUT_FAULTS:
            assert "disagree" in got["message"] and "rank 0" in got["message"] and "rank 1" in got["message"], got
        elif rank != bad_rank:
            assert f"rank {bad_rank}" in got["message"], got  # the others name the rank at fault
