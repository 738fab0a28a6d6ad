"""Renders the suite's results.json as table.md (moeblaze's step against SonicMoE, MegaBlocks
and the best other baseline; every impl's time and memory; moeblaze's per-kernel breakdown)
and tflops.png (TFLOP/s per shape and implementation against the dense GEMM ceiling). Needs no
GPU and no torch; merges several results files (e.g. two device runs).

Usage: python3 bench/report.py RESULTS.json [MORE.json ...] --out DIR"""
import argparse
import json
import zlib
from pathlib import Path

from tile_cost import table_lines, tile_costs

SUITE = json.loads((Path(__file__).resolve().parent / "suite.json").read_text())["shapes"]
# The held-out shapes run by name too (bench/plan.py): their plot bars are at their own T.
HELDOUT = json.loads((Path(__file__).resolve().parent / "heldout.json").read_text())["shapes"]


def suite_tokens(name):
    """The shape's benchmark T: the suite's, else the held-out set's; None for any other shape."""
    return next((s["T"] for s in SUITE + HELDOUT if s["name"] == name), None)


PEERS = ("sonicmoe", "megablocks")
# One colour per implementation, the same in every run and plot whichever others ran
# (examples/train_moe.py uses the same for moeblaze, grouped_mm and the eager loop).
COLOURS = {"moeblaze": "#d62728", "moeblaze-recompute": "#ff9896", "sonicmoe": "#2ca02c", "megablocks": "#9467bd",
           "torch-grouped_mm": "#1f77b4", "torch-loop": "#7f7f7f"}
OTHER_COLOURS = ("#8c564b", "#e377c2", "#bcbd22", "#17becf", "#ff7f0e")
PLOT_ORDER = ("moeblaze", "moeblaze-recompute") + PEERS + ("torch-grouped_mm", "torch-loop")
Y_LABEL = "TFLOP/s (model FLOPs of forward + backward / step time)"


def colour(impl):
    """The implementation's fixed colour; one from its name for an implementation not listed,
    so it too keeps its colour from run to run."""
    return COLOURS.get(impl) or OTHER_COLOURS[zlib.crc32(impl.encode()) % len(OTHER_COLOURS)]

SONIC_TARGET = 1 / 0.9  # moeblaze's step at most 0.9x SonicMoE's (docs/performance.md "Targets")


def groups(results):
    """(shape, routing, tokens) -> that case's rows, in run order."""
    out = {}
    for r in results:
        out.setdefault((r["shape"], r["routing"], r["tokens"]), []).append(r)
    return out


def _ratio(baseline, ours):
    """baseline step / moeblaze step (> 1: moeblaze faster); None when either has no numbers."""
    if not baseline or not ours or "error" in baseline or "error" in ours:
        return None
    return baseline["step_ms"] / ours["step_ms"]


def summarize(rows):
    """One case's summary: moeblaze's step and TFLOP/s, its ratio to each peer and to the best
    of the other (non-peer) baselines, recompute against save-h, and why a peer has no ratio."""
    by = {r["impl"]: r for r in rows}
    ours = by.get("moeblaze")
    s = {"shape": rows[0]["shape"], "routing": rows[0]["routing"], "tokens": rows[0]["tokens"],
         "moeblaze_step_ms": None, "moeblaze_tflops": None, "errors": {}}
    if ours and "error" not in ours:
        s["moeblaze_step_ms"], s["moeblaze_tflops"] = ours["step_ms"], ours["tflops"]
    for peer in PEERS:
        s[f"vs_{peer}"] = _ratio(by.get(peer), ours)
    others = [r for impl, r in by.items() if impl not in PEERS and not impl.startswith("moeblaze") and "error" not in r]
    best = min(others, key=lambda r: r["step_ms"]) if others else None
    s["best_other"] = best["impl"] if best else None
    s["vs_best_other"] = _ratio(best, ours)
    rec = by.get("moeblaze-recompute")
    s["recompute_over_save_h"] = _ratio(rec, ours)  # recompute's step over save-h's (target <= 1.3)
    for impl, r in by.items():
        if "error" in r:
            s["errors"][impl] = r["error"]
    return s


def _cell(ratio, impl, s):
    if ratio is not None:
        return f"{ratio:.2f}x"
    return "n/a" if impl in s["errors"] else "-"


def summary_lines(summaries):
    lines = ["| shape | routing | T | moeblaze step ms | TFLOP/s | vs SonicMoE | vs MegaBlocks | vs best other baseline | "
             "recompute / save-h |", "|---|---|---|---|---|---|---|---|---|"]
    for s in summaries:
        step = f"{s['moeblaze_step_ms']:.2f}" if s["moeblaze_step_ms"] is not None else "n/a"
        tf = f"{s['moeblaze_tflops']:.0f}" if s["moeblaze_tflops"] is not None else "n/a"
        best = f"{s['vs_best_other']:.2f}x ({s['best_other']})" if s["vs_best_other"] is not None else "-"
        rec = f"{s['recompute_over_save_h']:.2f}x" if s["recompute_over_save_h"] is not None else "-"
        lines.append(f"| {s['shape']} | {s['routing']} | {s['tokens']} | {step} | {tf} | "
                     f"{_cell(s['vs_sonicmoe'], 'sonicmoe', s)} | {_cell(s['vs_megablocks'], 'megablocks', s)} | "
                     f"{best} | {rec} |")
    reasons = sorted({f"{impl}: {why}" for s in summaries for impl, why in s["errors"].items()})
    if reasons:
        lines += ["", "n/a: the implementation ran into an error or was not available here:", ""]
        lines += [f"- {r}" for r in reasons]
    return lines


def write_table(res, path):
    groups_ = groups(res["results"])
    summaries = [summarize(rows) for rows in groups_.values()]
    lines = [f"# moeblaze suite, {res['date']}, {res['device']}, torch {res['torch']}"
             + (f", commit {res['commit']}" if res.get("commit") else ""), "",
             f"Ceilings in this run: dense bf16 GEMM {res['ceilings']['gemm_tflops']:.0f} TFLOP/s, copy "
             f"{res['ceilings']['copy_tbps']:.2f} TB/s.", "",
             "## moeblaze against each baseline", "",
             "vs X = X's step time / moeblaze's step time (step = forward + backward, median of the same number of "
             "steps, same inputs, same run): **above 1 moeblaze is faster**. Target against SonicMoE: "
             f"{SONIC_TARGET:.2f}x or more (moeblaze's step at most 0.9x SonicMoE's). Best other baseline: the "
             "fastest of the PyTorch baselines. recompute / save-h: moeblaze's recompute step over its save-h step "
             "(target: at most 1.3x).", ""] + summary_lines(summaries)
    paths = {}
    for r in res["results"]:
        if "routing_path" in r:
            paths.setdefault((r["impl"], r["routing"]), r["routing_path"])
    if paths:
        lines += ["", "Routing (bench/impls.py): random routing lets every impl route the same x with the same router "
                  "weights; top-k of the same logits picks the same experts whatever the gate function, so the "
                  "expert loads match (up to near-ties); skewed routing hands one fixed routing to every impl.", ""]
        lines += [f"- {impl}, {routing}: {p}" for (impl, routing), p in sorted(paths.items())]
    lines += ["", "## Every implementation", "",
              "Peak: the allocator trace replayed with the weight gradients left out at every moment "
              "(bench/peak_memory.py); in brackets, max_memory_allocated minus all weight gradients. "
              "act: memory held between forward and backward beyond the output.", "",
              "| shape | routing | T | impl | fwd ms | step ms | TFLOP/s | act MiB | peak MiB | step vs best baseline | peak vs best baseline |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for (shape, routing, T), rows in groups_.items():
        base = [r for r in rows if not r["impl"].startswith("moeblaze") and "error" not in r]
        best = min(base, key=lambda r: r["step_ms"]) if base else None
        best_peak = min((r["peak_mib"] for r in base), default=None)
        for r in rows:
            if "error" in r:
                lines.append(f"| {shape} | {routing} | {T} | {r['impl']} | {r['error'][:160]} | | | | | | |")
                continue
            ratio = f"{best['step_ms'] / r['step_ms']:.2f}x" if best else "-"
            pr = f"{r['peak_mib'] / best_peak:.2f}x" if best_peak else "-"
            alloc = f" ({r['peak_alloc_mib']:.0f})" if "peak_alloc_mib" in r else ""
            lines.append(f"| {shape} | {routing} | {T} | {r['impl']} | {r['fwd_ms']:.2f} | {r['step_ms']:.2f} | "
                         f"{r['tflops']:.0f} | {r['act_mib']:.0f} | {r['peak_mib']:.0f}{alloc} | {ratio} | {pr} |")
    pairs = []
    for (shape, routing, T), rows in groups_.items():
        by = {r["impl"]: r for r in rows if "error" not in r}
        if "moeblaze" in by and "moeblaze-recompute" in by:
            a, b = by["moeblaze"], by["moeblaze-recompute"]
            pairs.append(f"| {shape} | {routing} | {T} | {a['step_ms']:.2f} | {b['step_ms']:.2f} | "
                         f"{b['step_ms'] / a['step_ms']:.2f}x | {a['act_mib']:.0f} | {b['act_mib']:.1f} |")
    if pairs:
        lines += ["", "## recompute vs save-h (target: step at most 1.3x)", "",
                  "| shape | routing | T | save-h step ms | recompute step ms | ratio | save-h act MiB | recompute act MiB |",
                  "|---|---|---|---|---|---|---|---|"] + pairs
    for name, k in res["kernels"].items():
        if "kernels" not in k:
            continue
        lines += ["", f"## {name}: per-kernel breakdown (C++ bench, tuned kernels: {k.get('load', '')})", "",
                  "| kernel | tile | ms/step | floor ms | TFLOP/s | GB/s |", "|---|---|---|---|---|---|"]
        for kk in k["kernels"]:
            lines.append(f"| {kk['family']} | {kk['tile']} | {kk['ms']:.3f} | {kk['floor_ms']:.3f} | {kk['tflops']:.0f} | {kk['gbps']:.0f} |")
        lines.append(f"\nC++ step {k['step_ms']:.2f} ms (the binding's own step is in the table above).")
    costs = tile_costs(res, SUITE)
    if costs:
        lines += ["", "## Per-tile cost model (bench/tile_cost.py)", "",
                  "One SM's time per output tile, fitted across the shapes as overhead + k_steps x step "
                  "(random routing's tile counts): the overhead is what a tile costs beyond its mainloop, "
                  "the k-step rate what the mainloop runs at.", ""] + table_lines(costs)
    path.write_text("\n".join(lines) + "\n")


def write_plot(res, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    rows = [r for r in res["results"] if r["routing"] == "random" and "error" not in r]
    shapes = list(dict.fromkeys(r["shape"] for r in rows if r["tokens"] == suite_tokens(r["shape"])))
    order = PLOT_ORDER
    impls = sorted(dict.fromkeys(r["impl"] for r in rows),
                   key=lambda i: (order.index(i) if i in order else len(order), i))
    fig, ax = plt.subplots(figsize=(11, 5))
    width = 0.8 / max(1, len(impls))
    for i, impl in enumerate(impls):
        vals = []
        for s in shapes:
            m = [r["tflops"] for r in rows if r["impl"] == impl and r["shape"] == s
                 and r["tokens"] == suite_tokens(s)]
            vals.append(m[0] if m else 0)
        ax.bar([j + i * width for j in range(len(shapes))], vals, width, label=impl, color=colour(impl))
    ax.axhline(res["ceilings"]["gemm_tflops"], color="k", linestyle="--", label="dense GEMM ceiling")
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(shapes))], shapes, rotation=15)
    ax.set_ylabel(Y_LABEL)
    ax.set_title(f"MoE layer training step (forward + backward, bf16), {res['device']}: higher is faster")
    ax.legend(ncol=4, fontsize=8, loc="upper right")
    ax.set_ylim(0, res["ceilings"]["gemm_tflops"] * 1.25)  # room for the legend above the bars
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    # What was drawn: each implementation's bar colour, as the figure holds it.
    drawn = {c.get_label(): matplotlib.colors.to_hex(c.patches[0].get_facecolor()) for c in ax.containers if c.patches}
    plt.close(fig)
    return drawn


def write_outputs(res, out):
    """results.json, table.md and tflops.png under `out`; prints the table."""
    res["summary"] = [summarize(rows) for rows in groups(res["results"]).values()]
    (out / "results.json").write_text(json.dumps(res, indent=2))
    write_table(res, out / "table.md")
    write_plot(res, out / "tflops.png")
    print((out / "table.md").read_text())


def merge(files):
    """One results dict from several runs: the first run's header, every result and breakdown
    (a later run's entry for the same shape, routing, tokens and impl replaces an earlier one)."""
    runs = []
    for f in files:
        try:
            runs.append(json.loads(Path(f).read_text()))
        except (OSError, ValueError) as e:
            raise SystemExit(f"results: cannot read '{f}' as suite results JSON ({e})")
        if "results" not in runs[-1]:
            raise SystemExit(f"results: '{f}' has no 'results' list (not a suite.py results.json)")
    res = dict(runs[0])
    res["runs"] = [{k: r[k] for k in ("date", "device", "torch", "ceilings") if k in r} for r in runs]
    seen = {}
    for r in runs:
        for row in r["results"]:
            seen[(row["shape"], row["routing"], row["tokens"], row["impl"])] = row
        res.setdefault("kernels", {})
    res["results"] = list(seen.values())
    res["kernels"] = {k: v for r in runs for k, v in r.get("kernels", {}).items()}
    res["peers"] = {k: v for r in runs for k, v in r.get("peers", {}).items()}
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    write_outputs(merge(a.results), out)


if __name__ == "__main__":
    main()
