"""The moeblaze suite benchmark (docs/performance.md "Method"), on a GPU, in one invocation:
moeblaze (through the Python binding) against SonicMoE and MegaBlocks (bench/peers.py) and the
PyTorch baselines (bench/baselines.py), same inputs, same GPU, same timing (bench/measure.py):
forward and step (forward+backward) median ms over CUDA events, TFLOP/s = 18TKdn/step,
activation memory held between forward and backward beyond the output, and peak extra memory
of a step (weights and their gradients excluded); random and skewed routing; a token sweep; the
dense GEMM and copy ceilings measured in the same run; moeblaze's per-kernel breakdown from
`moeblaze bench --json`; optionally the per-kernel comparison with SonicMoE (bench/kernels.py).
Writes results.json, table.md and tflops.png (and kernels.md, kernels.json) under --out.

Usage: python3 bench/suite.py [--shapes NAME,...] [--routing random,skewed] [--impls ...]
       [--sweep] [--kernels SHAPE,...] [--peers DIR] [--deadline-s S] [--out DIR]
       python3 bench/suite.py --quick --out DIR      # A/B subset: 2 shapes, random, moeblaze + sonicmoe
       python3 bench/suite.py --dry-run [...]        # the cases and a time estimate; no GPU needed
moeblaze runs in save-h mode, moeblaze-recompute in recompute mode. Routing per impl: impls.py.
A peer that is missing or fails to load gets rows that say why; the rest of the suite runs."""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python"))
sys.path.insert(0, str(HERE))
import plan  # noqa: E402

FULL = {"shapes": tuple(plan.SHAPES), "routing": plan.ROUTINGS, "impls": plan.IMPLS}


def moeblaze_cli():
    """The CLI of the build whose library the binding loads (MOEBLAZE_LIBRARY=<build>/lib/...),
    so the per-kernel breakdown times the same kernels as the table; else build/bin."""
    lib = os.environ.get("MOEBLAZE_LIBRARY")
    if lib:
        cli = Path(lib).resolve().parent.parent / "bin" / "moeblaze"
        if cli.exists():
            return cli
    return HERE.parent / "build" / "bin" / "moeblaze"


def shape_args(name):
    """The CLI's options for a shape: its preset, or (a held-out shape) its dimensions and the
    held-out router (impls.HELDOUT_ROUTER)."""
    if name in plan.SHAPES:
        return ["--preset", name]
    s = plan.HELDOUT[name]
    return ["-E", str(s["E"]), "-K", str(s["K"]), "-d", str(s["d"]), "-n", str(s["n"]), "--router", "softmax",
            "--renormalize"]


def kernel_breakdown(name, T):
    cli = moeblaze_cli()
    try:
        out = subprocess.run([str(cli), "bench", *shape_args(name), "-T", str(T), "--json"], capture_output=True,
                             text=True, timeout=300, check=True)
        return json.loads(out.stdout)
    except Exception as e:  # noqa: BLE001 - a missing CLI must not lose the suite numbers
        return {"error": str(e)}


def commit():
    """The commit the run measures: MOEBLAZE_COMMIT when set (a copied checkout's .git may be older
    than its files: set it where the copy is made, e.g. to `git describe --always --dirty`), else
    git's HEAD, marked -dirty when tracked files differ from it."""
    if os.environ.get("MOEBLAZE_COMMIT"):
        return os.environ["MOEBLAZE_COMMIT"]
    try:
        return subprocess.run(["git", "-C", str(HERE), "describe", "--always", "--dirty"], capture_output=True,
                              text=True, timeout=10).stdout.strip() or None
    except Exception:  # noqa: BLE001 - the checkout on the GPU machine may have no git
        return None


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", help=f"default: all six ({','.join(FULL['shapes'])}); --quick: "
                                     f"{','.join(plan.QUICK['shapes'])}; the held-out shapes run by name "
                                     f"({','.join(plan.HELDOUT)})")
    ap.add_argument("--impls", help=f"default: {','.join(FULL['impls'])}; --quick: {','.join(plan.QUICK['impls'])}")
    ap.add_argument("--routing", help="default: random,skewed; --quick: random")
    ap.add_argument("--quick", action="store_true", help="the A/B subset (other options override its choices)")
    ap.add_argument("--sweep", action=argparse.BooleanOptionalAction, default=False,
                    help="token sweep T = 4096..65536 on --sweep-shapes (when in --shapes); --no-sweep undoes an "
                         "earlier --sweep (bench/run_suite.sh passes one)")
    ap.add_argument("--sweep-shapes", default="qwen3-30b-a3b,deepseek-v3")
    ap.add_argument("--sweep-impls", default=",".join(plan.DEFAULT_SWEEP_IMPLS),
                    help="impls of the sweep (those also in --impls); torch-loop is out by default: "
                         "~250 ms a step at any T")
    ap.add_argument("--kernels", default=None,
                    help="per-kernel comparison with SonicMoE on these shapes (bench/kernels.py), after the random "
                         "cases; 'none' for none (default: none; --quick: qwen3-30b-a3b)")
    ap.add_argument("--kernel-steps", type=int, default=3, help="profiled steps of the per-kernel comparison")
    ap.add_argument("--no-breakdown", action="store_true", help="skip `moeblaze bench --json` per shape")
    ap.add_argument("--peers", default=None, help="folder holding the peers' folders sonicmoe/ and megablocks/ "
                                                  "(default .peers at the repository root, or MOEBLAZE_PEERS)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--deadline-s", type=float, default=None,
                    help="skip the cases that would end past this many seconds from the start (their rows say so)")
    ap.add_argument("--dry-run", action="store_true", help="print the cases and the time estimate, run nothing")
    ap.add_argument("--out", default=str(HERE / "results" / datetime.date.today().isoformat()))
    a = ap.parse_args(argv)
    base = plan.QUICK if a.quick else FULL
    try:
        a.shape_list = plan.parse_list(a.shapes or ",".join(base["shapes"]), list(plan.ALL_SHAPES), "--shapes")
        a.impl_list = plan.parse_list(a.impls or ",".join(base["impls"]), plan.IMPLS, "--impls")
        a.routing_list = plan.parse_list(a.routing or ",".join(base["routing"]), plan.ROUTINGS, "--routing")
        a.sweep_shape_list = plan.parse_list(a.sweep_shapes, list(plan.SHAPES), "--sweep-shapes") if a.sweep else []
        a.sweep_impl_list = plan.parse_list(a.sweep_impls, plan.IMPLS, "--sweep-impls")
        kernels = a.kernels if a.kernels is not None else ("qwen3-30b-a3b" if a.quick else "none")
        a.kernel_list = [] if kernels == "none" else plan.parse_list(kernels, list(plan.SHAPES), "--kernels")
    except ValueError as e:
        ap.error(str(e))
    if a.steps < 10:
        ap.error("--steps: the median needs at least 10")
    if a.kernel_steps < 1:
        ap.error("--kernel-steps: at least 1")
    if a.deadline_s is not None and a.deadline_s <= 0:
        ap.error("--deadline-s: must be positive")
    return a


def run_case(case, steps, peers_root):
    import torch

    import impls
    from measure import measure

    shape = plan.ALL_SHAPES[case.shape]
    row = {"shape": case.shape, "impl": case.impl, "routing": case.routing, "tokens": case.tokens}
    inp = impls.make_inputs(shape, case.routing, case.tokens)
    try:
        impl = impls.build(case.impl, inp, peers_root)
        flops = 18.0 * case.tokens * shape["K"] * shape["d"] * shape["n"]
        row.update(measure(impl, inp.dy, flops, steps))
    except impls.Unavailable as e:
        row["error"] = f"unavailable: {e}"
    except torch.cuda.OutOfMemoryError as e:
        row["error"] = f"OOM: {e}"
    except Exception as e:  # noqa: BLE001 - one impl failing (a peer's bug) must not end the suite
        row["error"] = f"failed: {type(e).__name__}: {e}"
    return row


def main(argv=None):
    a = parse_args(argv)
    cases = plan.cases(a.shape_list, a.routing_list, a.impl_list, a.sweep_shape_list, a.sweep_impl_list)
    print(plan.describe(cases, a.kernel_list, a.deadline_s), flush=True)
    if a.dry_run:
        return
    t0 = time.monotonic()

    def left():
        return None if a.deadline_s is None else a.deadline_s - (time.monotonic() - t0)

    import torch

    import peers
    from measure import ceilings
    from report import write_outputs

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    peers_root = Path(a.peers) if a.peers else peers.default_root()
    res = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "device": torch.cuda.get_device_name(),
           "torch": torch.__version__, "commit": commit(), "args": " ".join(sys.argv[1:] if argv is None else argv),
           "ceilings": ceilings(), "results": [], "kernels": {}, "peers": {}}
    print(f"{res['device']} torch {res['torch']}: GEMM {res['ceilings']['gemm_tflops']:.0f} TFLOP/s, "
          f"copy {res['ceilings']['copy_tbps']:.2f} TB/s", flush=True)
    for name in plan.PEER_IMPLS:  # unpack and import before any timing; a failure is said once, here
        if name in a.impl_list or (name == "sonicmoe" and a.kernel_list):
            p = peers.load(name, peers_root)
            res["peers"][name] = {"folder": str(p.folder), "ok": p.ok, "reason": p.reason}
            print(f"peer {name}: {'loaded from ' + str(p.folder) if p.ok else p.reason}", flush=True)

    def at_suite_T(c):
        return c.routing == "random" and c.tokens == plan.ALL_SHAPES[c.shape]["T"]

    kernels_done = not a.kernel_list
    for i, case in enumerate(cases):
        if not kernels_done and not at_suite_T(case):
            run_kernel_compare(a, out, peers_root, left())
            kernels_done = True
        budget = left()
        if budget is not None and plan.case_seconds(case) > budget:
            r = {"shape": case.shape, "impl": case.impl, "routing": case.routing, "tokens": case.tokens,
                 "error": "skipped: --deadline-s"}
        else:
            r = run_case(case, a.steps, peers_root)
        res["results"].append(r)
        print(json.dumps(r), flush=True)
        torch.cuda.empty_cache()
        last_of_group = i + 1 == len(cases) or (cases[i + 1].shape, cases[i + 1].routing, cases[i + 1].tokens) != (
            case.shape, case.routing, case.tokens)
        if last_of_group and at_suite_T(case) and not a.no_breakdown and any(
                c.impl.startswith("moeblaze") for c in cases if c.shape == case.shape):
            budget = left()
            if budget is None or budget > plan.BREAKDOWN_S:
                res["kernels"][case.shape] = kernel_breakdown(case.shape, case.tokens)
        (out / "results.json").write_text(json.dumps(res, indent=2))  # partial results survive a kill
    if not kernels_done:
        run_kernel_compare(a, out, peers_root, left())
    write_outputs(res, out)
    errors = [r for r in res["results"] if "error" in r]
    if errors:
        print(f"{len(errors)} of {len(res['results'])} rows have no numbers: "
              + "; ".join(sorted({f"{r['impl']}: {r['error'][:120]}" for r in errors})), flush=True)


def run_kernel_compare(a, out, peers_root, budget):
    import kernels

    if budget is not None and budget < plan.KERNEL_COMPARE_S * len(a.kernel_list):
        print("per-kernel comparison skipped: --deadline-s", flush=True)
        return
    try:
        kernels.run(a.kernel_list, out, steps=a.kernel_steps, peers_root=peers_root)
        print(f"per-kernel comparison: {out / 'kernels.md'}", flush=True)
    except Exception as e:  # noqa: BLE001 - the suite's rows matter more than the comparison
        print(f"per-kernel comparison failed: {type(e).__name__}: {e}", flush=True)


if __name__ == "__main__":
    main()
