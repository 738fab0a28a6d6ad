"""Renders the suite's results.json as table.md (ratios against the best baseline, per-kernel
breakdown) and tflops.png (TFLOP/s per shape and implementation against the dense GEMM
ceiling). Needs no GPU and no torch; merges several results files (e.g. two device runs).

Usage: python3 bench/report.py RESULTS.json [MORE.json ...] --out DIR"""
import argparse
import json
from pathlib import Path

from tile_cost import table_lines, tile_costs

SUITE = json.loads((Path(__file__).resolve().parent / "suite.json").read_text())["shapes"]


def suite_tokens(name):
    return next(s["T"] for s in SUITE if s["name"] == name)


def write_table(res, path):
    lines = [f"# moeblaze suite, {res['date']}, {res['device']}, torch {res['torch']}", "",
             f"Ceilings in this run: dense bf16 GEMM {res['ceilings']['gemm_tflops']:.0f} TFLOP/s, copy "
             f"{res['ceilings']['copy_tbps']:.2f} TB/s.", "",
             "Peak: the allocator trace replayed with the weight gradients left out at every moment "
             "(bench/peak_memory.py); in brackets, max_memory_allocated minus all weight gradients.", "",
             "| shape | routing | T | impl | fwd ms | step ms | TFLOP/s | act MiB | peak MiB | step vs best baseline | peak vs best baseline |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    groups = {}
    for r in res["results"]:
        groups.setdefault((r["shape"], r["routing"], r["tokens"]), []).append(r)
    for (shape, routing, T), rows in groups.items():
        base = [r for r in rows if not r["impl"].startswith("moeblaze") and "error" not in r]
        best = min(base, key=lambda r: r["step_ms"]) if base else None
        best_peak = min((r["peak_mib"] for r in base), default=None)
        for r in rows:
            if "error" in r:
                lines.append(f"| {shape} | {routing} | {T} | {r['impl']} | {r['error']} | | | | | | |")
                continue
            ratio = f"{best['step_ms'] / r['step_ms']:.2f}x" if best else "-"
            pr = f"{r['peak_mib'] / best_peak:.2f}x" if best_peak else "-"
            alloc = f" ({r['peak_alloc_mib']:.0f})" if "peak_alloc_mib" in r else ""
            lines.append(f"| {shape} | {routing} | {T} | {r['impl']} | {r['fwd_ms']:.2f} | {r['step_ms']:.2f} | "
                         f"{r['tflops']:.0f} | {r['act_mib']:.0f} | {r['peak_mib']:.0f}{alloc} | {ratio} | {pr} |")
    pairs = []
    for (shape, routing, T), rows in groups.items():
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
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    fig, ax = plt.subplots(figsize=(10, 4.5))
    width = 0.8 / max(1, len(impls))
    for i, impl in enumerate(impls):
        vals = []
        for s in shapes:
            m = [r["tflops"] for r in rows if r["impl"] == impl and r["shape"] == s
                 and r["tokens"] == suite_tokens(s)]
            vals.append(m[0] if m else 0)
        ax.bar([j + i * width for j in range(len(shapes))], vals, width, label=impl)
    ax.axhline(res["ceilings"]["gemm_tflops"], color="k", linestyle="--", label="dense GEMM ceiling")
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(shapes))], shapes, rotation=15)
    ax.set_ylabel("TFLOP/s (18TKdn / step)")
    ax.set_title(f"MoE layer forward+backward, {res['device']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)



def write_outputs(res, out):
    """results.json, table.md and tflops.png under `out`; prints the table."""
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
