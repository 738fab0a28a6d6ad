#!/usr/bin/env python3
"""Fits the tile cost model's constants (generator/cost_model.cpp) to measured kernel times.

The model (generator/cost_model.hpp) predicts one launch of an expert GEMM as

    launch_us + dram * dram_us + mainloop[c] * mainloop_us + tile_us[c] * tiles
              + output_us_per_kib[c] * output_kib

where the terms come from the tile's geometry (`moeblaze space --terms` computes them, so the
model's structure lives in C++ alone) and c is the tile's class (kernel-layer ping-pong,
kernel-layer cooperative, hand-written). This script gathers every (device, layer, T, family,
tile, ms) of the suite runs bench/cost_model_runs.txt names (their per-kernel tables; add a new
run's folder there to refit with it), asks the binary
for the terms, and solves for the eleven constants by non-negative least squares on the
relative error. It prints the table to paste into cost_model.cpp, the fit's errors, and how
often the model orders two measured tiles of one (device, shape, family) as they ran.

Usage: bench/fit_cost_model.py --moeblaze build/bin/moeblaze [--results DIR ...] [--json OUT]
       [--check]   (exit 1 unless the binary's table is what this fit gives, within 2%)
"""
import argparse
import glob
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from tile_cost import OLDER_FAMILY  # noqa: E402  (the families' older names, as earlier runs record them)

HERE = pathlib.Path(__file__).resolve().parent
FAMILIES = ("gate_up", "down_proj", "down_dgrad", "gate_up_dgrad", "gate_up_wgrad", "down_wgrad")
CLASSES = 3
PARAMS = (["launch_us", "dram"] + [f"mainloop[{c}]" for c in range(CLASSES)] +
          [f"tile_us[{c}]" for c in range(CLASSES)] + [f"output_us_per_kib[{c}]" for c in range(CLASSES)])


def parse_layer(text):
    """(E, K, d, n, activation) of a layer description 'E=32 K=4 d=2880 n=2880 swiglu ...'."""
    words = text.split()
    vals = dict(w.split("=", 1) for w in words if "=" in w)
    act = next((w for w in words if "=" not in w), "swiglu")
    return int(vals["E"]), int(vals["K"]), int(vals["d"]), int(vals["n"]), act


def device_of(text):
    return "h200" if "H200" in (text or "") else "h100"


def collect_rows(result_files):
    """Measured rows, one per (device, layer, T, family, tile): the median of the runs' ms."""
    groups = {}
    for path in result_files:
        try:
            report = json.loads(pathlib.Path(path).read_text())
        except (OSError, ValueError) as e:
            raise SystemExit(f"--results: cannot read {path}: {e}")
        kernels = report.get("kernels") if isinstance(report, dict) else None
        if not isinstance(kernels, dict):
            continue
        for entry in kernels.values():
            if not isinstance(entry, dict) or "kernels" not in entry or "layer" not in entry:
                continue
            try:
                E, K, d, n, act = parse_layer(entry["layer"])
            except (KeyError, ValueError):
                raise SystemExit(f"--results: {path}: layer '{entry['layer']}' is not 'E=.. K=.. d=.. n=.. activation'")
            T = int(entry.get("tokens", 0))
            dev = device_of(entry.get("device") or report.get("device"))
            for k in entry["kernels"]:
                fam = OLDER_FAMILY.get(k.get("family"), k.get("family"))
                if fam not in FAMILIES or not k.get("ms") or T <= 0:
                    continue
                key = (dev, E, K, d, n, act, T, fam, k["tile"])
                groups.setdefault(key, []).append(float(k["ms"]))
    rows = []
    for (dev, E, K, d, n, act, T, fam, tile), ms in sorted(groups.items()):
        rows.append({"E": E, "K": K, "d": d, "n": n, "activation": act, "T": T, "family": fam, "tile": tile,
                     "device": dev, "ms": statistics.median(ms)})
    return rows


def features(row):
    t = row["terms"]
    c = t["tile_class"]
    x = [1.0, t["dram_us"]] + [0.0] * (3 * CLASSES)
    x[2 + c] = t["mainloop_us"]
    x[2 + CLASSES + c] = t["tiles"]
    x[2 + 2 * CLASSES + c] = t["output_kib"]
    return x


def solve(a, b):
    """x with a x = b (small dense system, Gaussian elimination with partial pivoting)."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[piv][col]) < 1e-300:
            raise ArithmeticError("singular")
        m[col], m[piv] = m[piv], m[col]
        for r in range(n):
            if r != col:
                f = m[r][col] / m[col][col]
                for k in range(col, n + 1):
                    m[r][k] -= f * m[col][k]
    return [m[i][n] / m[i][i] for i in range(n)]


def nnls(xs, ys, iters=200):
    """Lawson-Hanson non-negative least squares: min |X p - y| with p >= 0 (X rows xs)."""
    n = len(xs[0])
    p = [0.0] * n
    passive = set()

    def gradient(p):
        r = [y - sum(a * b for a, b in zip(x, p)) for x, y in zip(xs, ys)]
        return [sum(x[j] * ri for x, ri in zip(xs, r)) for j in range(n)]

    def ls(cols):
        cols = sorted(cols)
        a = [[sum(x[i] * x[j] for x in xs) for j in cols] for i in cols]
        b = [sum(x[i] * y for x, y in zip(xs, ys)) for i in cols]
        for i in range(len(cols)):
            a[i][i] += 1e-12 * (1 + a[i][i])
        z = [0.0] * n
        for j, v in zip(cols, solve(a, b)):
            z[j] = v
        return z

    for _ in range(iters):
        w = gradient(p)
        free = [j for j in range(n) if j not in passive and w[j] > 1e-10 * (1 + abs(w[j]))]
        if not free:
            break
        passive.add(max(free, key=lambda j: w[j]))
        while True:
            z = ls(passive)
            if all(z[j] > 0 for j in passive):
                p = z
                break
            alpha = min(p[j] / (p[j] - z[j]) for j in passive if z[j] <= 0)
            p = [pj + alpha * (zj - pj) for pj, zj in zip(p, z)]
            passive = {j for j in passive if p[j] > 1e-12}
    return p


def fit(rows):
    """The constants minimising the squared relative error, non-negative."""
    xs = [[v / (r["ms"] * 1e3) for v in features(r)] for r in rows]
    ys = [1.0] * len(rows)
    return nnls(xs, ys)


def predict(params, row):
    return sum(a * b for a, b in zip(params, features(row)))


def order_agreement(rows, params):
    """Pairs of differently tiled rows of one (device, shape, T, family) whose measured times
    differ by more than 3% and that the model tells apart: (pairs, pairs the model orders the
    same way, pairs it predicts equal). The model does not tell apart what its terms do not see
    (hand-written variants of one size and schedule, tile orders): those are its ties."""
    groups = {}
    for r in rows:
        groups.setdefault((r["device"], r["E"], r["K"], r["d"], r["n"], r["T"], r["family"]), []).append(r)
    pairs = agree = ties = 0
    for g in groups.values():
        for i in range(len(g)):
            for j in range(i + 1, len(g)):
                a, b = g[i], g[j]
                if abs(a["ms"] - b["ms"]) <= 0.03 * min(a["ms"], b["ms"]):
                    continue
                pa, pb = predict(params, a), predict(params, b)
                if abs(pa - pb) <= 1e-9 * max(pa, pb):
                    ties += 1
                    continue
                pairs += 1
                agree += (a["ms"] < b["ms"]) == (pa < pb)
    return pairs, agree, ties


def terms_from_binary(binary, rows):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump([{k: r[k] for k in ("E", "K", "d", "n", "activation", "T", "family", "tile", "device")} for r in rows],
                  f)
        path = f.name
    try:
        out = subprocess.run([str(binary), "space", "--terms", path], capture_output=True, text=True)
    finally:
        pathlib.Path(path).unlink()
    if out.returncode != 0:
        raise SystemExit(f"--moeblaze: `{binary} space --terms` failed: {out.stderr.strip()}")
    doc = json.loads(out.stdout)
    for r, t in zip(rows, doc["rows"]):
        r["terms"] = t["terms"]
    return doc["constants"]


def table_text(params):
    p = dict(zip(PARAMS, params))
    three = lambda name: "{" + ", ".join(f"{p[f'{name}[{c}]']:.4g}" for c in range(CLASSES)) + "}"
    return (f"    /*launch_us=*/{p['launch_us']:.4g},\n    /*dram=*/{p['dram']:.4g},\n"
            f"    /*mainloop=*/{three('mainloop')},\n    /*tile_us=*/{three('tile_us')},\n"
            f"    /*output_us_per_kib=*/{three('output_us_per_kib')},")


def binary_params(constants):
    return ([constants["launch_us"], constants["dram"]] + list(constants["mainloop"]) + list(constants["tile_us"]) +
            list(constants["output_us_per_kib"]))


def summary(rows, params):
    errs = sorted(abs(predict(params, r) / (r["ms"] * 1e3) - 1) for r in rows)
    pairs, agree, ties = order_agreement(rows, params)
    return {"rows": len(rows), "median_rel_error": errs[len(errs) // 2], "p90_rel_error": errs[int(0.9 * (len(errs) - 1))],
            "ordered_pairs": pairs, "ordered_same": agree, "model_ties": ties}


def fitted_runs():
    """The run folders the constants were fitted to (bench/cost_model_runs.txt)."""
    names = [line.strip() for line in (HERE / "cost_model_runs.txt").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    return [str(HERE / "results" / n) for n in names]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--moeblaze", required=True, help="the moeblaze binary (its `space --terms` computes the terms)")
    ap.add_argument("--results", nargs="*", default=None,
                    help="results.json files or folders holding one (default: the runs bench/cost_model_runs.txt "
                         "names, those the constants were fitted to)")
    ap.add_argument("--json", help="write the fit (constants, errors, rows) here")
    ap.add_argument("--check", action="store_true", help="exit 1 unless the binary's table matches this fit within 2%%")
    a = ap.parse_args(argv)
    if not pathlib.Path(a.moeblaze).is_file():
        ap.error(f"--moeblaze: no file at {a.moeblaze}")
    files = []
    for item in a.results if a.results is not None else fitted_runs():
        p = pathlib.Path(item)
        if p.is_dir():
            files += sorted(glob.glob(str(p / "**" / "results.json"), recursive=True))
        elif p.is_file():
            files.append(str(p))
        else:
            ap.error(f"--results: no file or folder at {item}")
    rows = collect_rows(files)
    if len(rows) < len(PARAMS):
        ap.error(f"--results: {len(rows)} measured kernels in {len(files)} files, too few to fit {len(PARAMS)} constants")
    constants = terms_from_binary(a.moeblaze, rows)
    params = fit(rows)
    s = summary(rows, params)
    current = binary_params(constants)
    s_current = summary(rows, current)
    print(f"{s['rows']} measured kernels from {len(files)} runs")
    print("fitted table (generator/cost_model.cpp kConstants):")
    print(table_text(params))
    print(f"fit: median relative error {s['median_rel_error']:.1%}, p90 {s['p90_rel_error']:.1%}; "
          f"orders {s['ordered_same']} of {s['ordered_pairs']} measured pairs (>3% apart) as they ran, "
          f"{s['model_ties']} more it cannot tell apart")
    print(f"the binary's table: median relative error {s_current['median_rel_error']:.1%}, "
          f"p90 {s_current['p90_rel_error']:.1%}; orders {s_current['ordered_same']} of {s_current['ordered_pairs']}")
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps({"constants": dict(zip(PARAMS, params)), "summary": s,
                                                    "rows": rows}, indent=1))
    if a.check:
        off = [(n, c, f) for n, c, f in zip(PARAMS, current, params) if abs(c - f) > 0.02 * max(abs(f), 1e-3)]
        if off:
            for n, c, f in off:
                print(f"check: {n} is {c:.4g} in the binary, the fit gives {f:.4g}", file=sys.stderr)
            return 1
        print("check: the binary's table is this fit's")
    return 0


if __name__ == "__main__":
    sys.exit(main())
