"""The held-out benchmark (bench/heldout.json): how the defaults and the tuner do on public layer
shapes that no default, override or cost-model constant was fitted to.

For each shape, on the GPU machine:
1. `moeblaze tune` from an empty cache (--budget, --candidates, --widen as a user would run it):
   its wall time and compile seconds, and its own interleaved step of the default and the tuned
   layer (the same process, the same inputs).
2. An exhaustive search of a sample of families (--exhaustive): `moeblaze tune --family F
   --candidates 1000` into a separate cache, so every legal tile of the family's space is timed
   beside the default in one process.
3. The suite's step of the tuned layer beside SonicMoE (bench/run_suite.sh with the tuned cache),
   all shapes in one invocation.
Writes DIR/results.json (every report) and DIR/table.md (the three tables and the targets).

Usage: python3 bench/heldout.py --out DIR [--shapes a,b] [--exhaustive down_proj,gate_up_wgrad]
       [--parts tune,exhaustive,suite] [--exhaustive-seed DB] [--budget S] [--candidates N]
       [--widen N] [--deadline-s S] [--dry-run]
       python3 bench/heldout.py --out DIR --table-only RESULTS.json [RESULTS.json ...]

--parts runs a subset (a GPU call of ten minutes holds about two shapes' tunes, not their
searches and suite too); the suite alone runs DIR/tuned.db that an earlier call's tune left
there. --table-only merges the results.json of such calls.
--exhaustive-seed copies a cache that already holds the searched tiles' binaries (compiled
without a GPU: `moeblaze tune ... --family F --candidates 1000 --db DB` on a machine with no GPU
only compiles, so `--parts exhaustive` run there leaves DIR/exhaustive.db as that seed) to
DIR/exhaustive.db, so the GPU machine only times them. The tune from an empty
cache is never seeded: its compile time is one of the targets.
Environment: as bench/run_suite.sh (BUILD, MOEBLAZE_PEERS, MOEBLAZE_QUACK_RESTORE, ...)."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

HERE = Path(__file__).resolve().parent
HELDOUT = json.loads((HERE / "heldout.json").read_text())["shapes"]
BY_NAME = {s["name"]: s for s in HELDOUT}
# The sample of families searched exhaustively: one slot-tiled GEMM with a light epilogue, one
# with the gathered SwiGLU epilogue, one weight gradient.
DEFAULT_EXHAUSTIVE = ("down_proj", "gate_up", "gate_up_wgrad")
# Targets of the tuner issue: the default within 3% of the exhaustive best in every family
# sampled, tuning at least 3% faster on average and never slower, the tuned step ahead of SonicMoE,
# a tune within 3 minutes.
DEFAULT_WITHIN = 1.03
TUNE_GAIN = 1.03
TUNE_SECONDS = 180
PARTS = ("tune", "exhaustive", "suite")


def layer_args(shape: dict) -> List[str]:
    """moeblaze's options for a held-out layer, with the router every impl runs on these shapes
    (impls.HELDOUT_ROUTER: softmax top-k, renormalised)."""
    return ["-E", str(shape["E"]), "-K", str(shape["K"]), "-d", str(shape["d"]), "-n", str(shape["n"]),
            "-T", str(shape["T"]), "--router", "softmax", "--renormalize", "--routing", "router"]


def tune_command(cli: str, shape: dict, db: Path, budget: float, candidates: int, widen: int) -> List[str]:
    return [cli, "tune", *layer_args(shape), "--db", str(db), "--json", "--quiet", "--budget", str(budget),
            "--candidates", str(candidates), "--widen", str(widen)]


def exhaustive_command(cli: str, shape: dict, db: Path, family: str, budget: float) -> List[str]:
    return [cli, "tune", *layer_args(shape), "--db", str(db), "--json", "--quiet", "--budget", str(budget),
            "--family", family, "--candidates", "1000"]


def suite_command(out: Path, shapes: List[str], deadline_s: float) -> List[str]:
    return [str(HERE / "run_suite.sh"), str(out), "--no-sweep", "--impls", "moeblaze,sonicmoe", "--routing", "random",
            "--shapes", ",".join(shapes), "--kernels", "none", "--deadline-s", str(int(deadline_s))]


def run_json(cmd: List[str], timeout: float) -> dict:
    """The command's JSON report with its wall seconds; {"error": ...} when it failed or timed out."""
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=max(1.0, timeout))
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s", "wall_s": time.monotonic() - t0}
    wall = time.monotonic() - t0
    try:
        report = json.loads(p.stdout)
    except json.JSONDecodeError:
        return {"error": f"exit {p.returncode}: {(p.stderr or p.stdout).strip()[-400:]}", "wall_s": wall}
    report["wall_s"] = wall
    if isinstance(report.get("error"), dict):  # the CLI's --json failure: {"kind", "message", "exit_code"}
        report["error"] = report["error"].get("message") or json.dumps(report["error"])
    if p.returncode != 0:
        report.setdefault("error", f"exit {p.returncode}: {p.stderr.strip()[-400:]}")
    return report


# ---- tables ---------------------------------------------------------------------------------


def merge_results(runs: List[dict]) -> dict:
    """Several calls' results.json as one: each shape's tune and exhaustive reports and the suite's
    rows, a later run's report replacing an earlier one for the same shape and family."""
    merged: Dict = {"meta": {}, "shapes": {}, "suite": {"results": []}}
    for r in runs:
        for k, v in r.get("meta", {}).items():
            if v not in (None, "", []) or k not in merged["meta"]:
                merged["meta"][k] = v
        for name, rep in r.get("shapes", {}).items():
            m = merged["shapes"].setdefault(name, {"exhaustive": {}})
            if "tune" in rep:
                m["tune"] = rep["tune"]
            m["exhaustive"].update(rep.get("exhaustive", {}))
        rows = r.get("suite", {}).get("results", [])
        keys = {(x.get("shape"), x.get("impl"), x.get("routing")) for x in rows}
        merged["suite"]["results"] = [x for x in merged["suite"]["results"]
                                      if (x.get("shape"), x.get("impl"), x.get("routing")) not in keys] + rows
    return merged


def family_row(report: dict, family: str) -> Optional[dict]:
    return next((f for f in report.get("families", []) if f.get("family") == family), None)


def suite_step(suite: dict, shape: str, impl: str) -> Optional[float]:
    for r in suite.get("results", []):
        if r.get("shape") == shape and r.get("impl") == impl and r.get("routing") == "random" and "error" not in r:
            return r["step_ms"]
    return None


def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return a / b if a and b else None


def fmt_ratio(r: Optional[float]) -> str:
    return "-" if r is None else f"{r:.3f}x"


def fmt_ms(v: Optional[float]) -> str:
    return "-" if not v else f"{v:.3f}"


def summarize(results: dict) -> dict:
    """Per shape and per sampled family, the numbers the targets are judged on."""
    shapes, families = [], []
    suite = results.get("suite", {})
    for name, r in results["shapes"].items():
        tune = r.get("tune", {})
        default, tuned = tune.get("step_default_ms"), tune.get("step_tuned_ms")
        sonic, ours = suite_step(suite, name, "sonicmoe"), suite_step(suite, name, "moeblaze")
        # Where the tuner kept every family's default, the two steps run the same kernels: their
        # ratio is the run's noise, and the gain is exactly 1.
        fams = tune.get("families", [])
        same = bool(fams) and all(f.get("winner") == f.get("default") for f in fams)
        gain = 1.0 if same and default and tuned else ratio(default, tuned)
        shapes.append({"shape": name, "kind": BY_NAME[name]["kind"], "tune_s": tune.get("wall_s"),
                       "compile_s": tune.get("compile_seconds"), "error": tune.get("error", ""),
                       "same_kernels": same,
                       "step_default_ms": default, "step_tuned_ms": tuned, "tuned_gain": gain,
                       "suite_moeblaze_ms": ours, "suite_sonicmoe_ms": sonic, "vs_sonicmoe": ratio(sonic, ours)})
        for fam, rep in r.get("exhaustive", {}).items():
            row = family_row(rep, fam) or {}
            picked = family_row(tune, fam) or {}
            families.append({"shape": name, "family": fam, "error": rep.get("error", ""),
                             "default": row.get("default"), "default_ms": row.get("default_ms"),
                             "tuned": picked.get("winner"), "tuned_ms": picked.get("winner_ms"),
                             "best": row.get("winner"), "best_ms": row.get("winner_ms"),
                             "timed": row.get("candidates"), "default_over_best": ratio(row.get("default_ms"), row.get("winner_ms"))})
    gains = [s["tuned_gain"] for s in shapes if s["tuned_gain"]]
    return {"shapes": shapes, "families": families,
            "mean_tuned_gain": sum(gains) / len(gains) if gains else None,
            "min_tuned_gain": min(gains) if gains else None}


def table(results: dict) -> str:
    s = summarize(results)
    meta = results.get("meta", {})
    lines = [f"# Held-out shapes: defaults, the tuner and an exhaustive sample beside SonicMoE ({meta.get('date', '')})", "",
             f"Device: {meta.get('device', '?')}. moeblaze tune: --budget {meta.get('budget')} --candidates "
             f"{meta.get('candidates')} --widen {meta.get('widen')}, from an empty cache. Steps: the tuner's own "
             "interleaved default / tuned step (same process, same inputs; where the tuner kept every default the "
             "two run the same kernels and the gain is 1); vs SonicMoE: the suite's step of the "
             "tuned layer against SonicMoE's in one invocation (above 1 moeblaze is faster).", "",
             "| shape | kind | tune s (compiling) | default step ms | tuned step ms | tuned gain | moeblaze tuned ms (suite) | SonicMoE ms | vs SonicMoE |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in s["shapes"]:
        tune_s = "-" if r["tune_s"] is None else f"{r['tune_s']:.0f} ({(r['compile_s'] or 0):.0f})"
        if r["error"]:
            tune_s += f" error: {r['error'][:80]}"
        lines.append(f"| {r['shape']} | {r['kind']} | {tune_s} | {fmt_ms(r['step_default_ms'])} | {fmt_ms(r['step_tuned_ms'])} | "
                     f"{fmt_ratio(r['tuned_gain'])}{' (defaults kept)' if r['same_kernels'] else ''} | {fmt_ms(r['suite_moeblaze_ms'])} | {fmt_ms(r['suite_sonicmoe_ms'])} | "
                     f"{fmt_ratio(r['vs_sonicmoe'])} |")
    lines += ["", "Exhaustive sample: every legal tile of the family's space timed beside the default in one process "
              "(`tune --family F --candidates 1000`); default / best above 1 means the default is slower.", "",
              "| shape | family | default | default ms | tuner's pick | pick ms | best | best ms | tiles timed | default / best |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for f in s["families"]:
        lines.append(f"| {f['shape']} | {f['family']} | {f['default'] or '-'} | {fmt_ms(f['default_ms'])} | {f['tuned'] or '-'} | "
                     f"{fmt_ms(f['tuned_ms'])} | {f['best'] or '-'} | {fmt_ms(f['best_ms'])} | {f['timed'] or '-'} | "
                     f"{fmt_ratio(f['default_over_best'])}" + (f" (error: {f['error'][:60]})" if f["error"] else "") + " |")
    met = lambda ok: "met" if ok else "not met"  # noqa: E731
    fams = [f["default_over_best"] for f in s["families"] if f["default_over_best"]]
    vs = [r["vs_sonicmoe"] for r in s["shapes"] if r["vs_sonicmoe"]]
    tunes = [r["tune_s"] for r in s["shapes"] if r["tune_s"] is not None]
    lines += ["", "Targets:",
              f"- default within 3% of the exhaustive best in every family sampled: "
              f"{met(fams and max(fams) <= DEFAULT_WITHIN)} (worst {fmt_ratio(max(fams) if fams else None)})",
              f"- tuning at least 3% faster on average and never slower: "
              f"{met(s['mean_tuned_gain'] and s['mean_tuned_gain'] >= TUNE_GAIN and s['min_tuned_gain'] >= 1.0)} "
              f"(mean {fmt_ratio(s['mean_tuned_gain'])}, worst {fmt_ratio(s['min_tuned_gain'])})",
              f"- tuned step ahead of SonicMoE on every shape: {met(vs and len(vs) == len(s['shapes']) and min(vs) > 1.0)} "
              f"(worst {fmt_ratio(min(vs) if vs else None)})",
              f"- a tune within {TUNE_SECONDS} s: {met(tunes and len(tunes) == len(s['shapes']) and max(tunes) <= TUNE_SECONDS)} "
              f"(longest {max(tunes):.0f} s)" if tunes else f"- a tune within {TUNE_SECONDS} s: not run", ""]
    return "\n".join(lines)


# ---- the run --------------------------------------------------------------------------------


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--shapes", default=",".join(BY_NAME), help="held-out shapes (default: all)")
    ap.add_argument("--exhaustive", default=",".join(DEFAULT_EXHAUSTIVE),
                    help="families searched exhaustively on every shape ('' for none)")
    ap.add_argument("--budget", type=float, default=120, help="tune's timing budget, seconds")
    ap.add_argument("--exhaustive-budget", type=float, default=240, help="each exhaustive search's timing budget")
    ap.add_argument("--candidates", type=int, default=12)
    ap.add_argument("--widen", type=int, default=1)
    ap.add_argument("--deadline-s", type=float, default=0, help="start nothing after this many seconds (0: none)")
    ap.add_argument("--moeblaze", default=os.path.join(os.environ.get("BUILD", "build"), "bin", "moeblaze"))
    ap.add_argument("--parts", default=",".join(PARTS), help="which of tune, exhaustive, suite to run")
    ap.add_argument("--exhaustive-seed", type=Path,
                    help="a cache holding the exhaustive tiles' binaries, copied to DIR/exhaustive.db first")
    ap.add_argument("--dry-run", action="store_true", help="print the commands and exit")
    ap.add_argument("--table-only", type=Path, nargs="+",
                    help="render DIR/table.md from these results.json (merged, later files adding to earlier) and exit")
    a = ap.parse_args(argv)
    if a.table_only:
        merged = merge_results([json.loads(p.read_text()) for p in a.table_only])
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "results.json").write_text(json.dumps(merged, indent=1))
        (a.out / "table.md").write_text(table(merged))
        return 0
    parts = [p for p in a.parts.split(",") if p]
    if not parts or any(p not in PARTS for p in parts):
        ap.error(f"--parts: {a.parts!r}: name some of {', '.join(PARTS)}")
    if a.exhaustive_seed and not a.exhaustive_seed.is_file():
        ap.error(f"--exhaustive-seed: {a.exhaustive_seed}: not a file (a cache of compiled exhaustive tiles)")
    shapes = [s for s in a.shapes.split(",") if s]
    unknown = [s for s in shapes if s not in BY_NAME]
    if unknown or not shapes:
        ap.error(f"--shapes: unknown {unknown} (held-out shapes: {', '.join(BY_NAME)})")
    families = [f for f in a.exhaustive.split(",") if f]
    tuned_db, exh_db = a.out / "tuned.db", a.out / "exhaustive.db"
    plan = []
    for name in shapes:
        if "tune" in parts:
            plan.append(("tune", name, None,
                         tune_command(a.moeblaze, BY_NAME[name], tuned_db, a.budget, a.candidates, a.widen)))
        for f in families if "exhaustive" in parts else []:
            plan.append(("exhaustive", name, f, exhaustive_command(a.moeblaze, BY_NAME[name], exh_db, f, a.exhaustive_budget)))
    suite_cmd = suite_command(a.out / "suite", shapes, 0)
    if a.dry_run:
        for _, _, _, cmd in plan:
            print(" ".join(cmd))
        if "suite" in parts:
            print("MOEBLAZE_CACHE=" + str(tuned_db), " ".join(suite_cmd))
        return 0
    a.out.mkdir(parents=True, exist_ok=True)
    for part, db in (("tune", tuned_db), ("exhaustive", exh_db)):
        if part in parts and db.exists():
            ap.error(f"--out: {db} exists: the tunes start from an empty cache (name a new folder)")
    if "suite" in parts and "tune" not in parts and not tuned_db.exists():
        ap.error(f"--parts: the suite without tune runs {tuned_db}, an earlier call's tuned cache: not found")
    if a.exhaustive_seed and "exhaustive" in parts:
        shutil.copyfile(a.exhaustive_seed, exh_db)
    t0 = time.monotonic()
    left = lambda: (a.deadline_s - (time.monotonic() - t0)) if a.deadline_s else 1e9  # noqa: E731
    results: Dict = {"meta": {"date": time.strftime("%Y-%m-%dT%H:%M:%S"), "budget": a.budget, "candidates": a.candidates,
                              "widen": a.widen, "exhaustive": families, "device": ""},
                     "shapes": {n: {"exhaustive": {}} for n in shapes}}
    for kind, name, fam, cmd in plan:
        if left() <= 60:
            print(f"heldout: deadline: {kind} {name} {fam or ''} not started", file=sys.stderr)
            continue
        rep = run_json(cmd, left() - 30)
        print(f"heldout: {kind} {name} {fam or ''}: {rep.get('wall_s', 0):.0f} s {rep.get('error', '')}", file=sys.stderr)
        results["meta"]["device"] = results["meta"]["device"] or rep.get("device", "")
        if kind == "tune":
            results["shapes"][name]["tune"] = rep
        else:
            results["shapes"][name]["exhaustive"][fam] = rep
        (a.out / "results.json").write_text(json.dumps(results, indent=1))
    if "suite" in parts and left() > 120:
        env = dict(os.environ, MOEBLAZE_CACHE=str(tuned_db.resolve()))
        cmd = suite_command(a.out / "suite", shapes, left() - 30)
        subprocess.run(cmd, env=env, timeout=left(), check=False)
        suite_json = a.out / "suite" / "results.json"
        if suite_json.exists():
            results["suite"] = json.loads(suite_json.read_text())
    (a.out / "results.json").write_text(json.dumps(results, indent=1))
    (a.out / "table.md").write_text(table(results))
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
