#!/usr/bin/env python3
"""Per-tile cost model of the expert GEMMs, fitted across the suite shapes of one run.

For every (family, tile) that ran on at least three shapes of a suite run (results.json's
per-kernel tables), the time one SM spends on one output tile is fitted as

    us_per_tile = overhead_us + k_steps * step_us

where k_steps is the tile's depth in 64-wide k steps (the reduction length over 64: d, n or
2n for the slot-tiled GEMMs, an expert's slots for the weight gradients) and the tile count
comes from the shape (random routing: T*K/E slots per expert). `overhead_us` is what a tile
costs beyond its mainloop (epilogue, pipeline refill, schedule), `step_us` the mainloop's
k-step, reported also as the rate it implies over 132 SMs. Short tiles (many-expert weight
gradients: 8-10 k-steps) pay the overhead most; a change that overlaps epilogues should lower
overhead_us and leave step_us alone.

Usage: bench/tile_cost.py results.json [--sms 132]
"""
import argparse
import json
import math
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
# Families under their older names (docs/design.md, "Glossary"), which earlier suite runs
# (bench/results/) record.
OLDER_FAMILY = {"up_proj": "gate_up", "up_wgrad": "gate_up_wgrad", "up_dgrad": "gate_up_dgrad"}


def tile_dims(tile):
    """(bm, bn) of a tile name 'BMxBNxBK_...'."""
    bm, bn = tile.split("_")[0].split("x")[:2]
    return int(bm), int(bn)


def tile_geometry(family, shape, bm, bn):
    """(tiles, k_steps, flops_per_k_step) of one launch of `family` on `shape` (gated SwiGLU)."""
    E, K, d, n, T = shape["E"], shape["K"], shape["d"], shape["n"], shape["T"]
    slots = T * K / E  # per expert, random routing
    m_tiles = E * math.ceil(slots / bm)  # slot-tiled GEMMs: an expert's rows in BM blocks
    if family == "gate_up":  # [A|B]: BN columns of W1 and of W3 per block
        return m_tiles * math.ceil(n / bn), math.ceil(d / 64), 2 * bm * 2 * bn * 64
    if family == "down_proj":
        return m_tiles * math.ceil(d / bn), math.ceil(n / 64), 2 * bm * bn * 64
    if family == "down_dgrad":
        return m_tiles * math.ceil(n / bn), math.ceil(d / 64), 2 * bm * bn * 64
    if family == "gate_up_dgrad":
        return m_tiles * math.ceil(d / bn), math.ceil(2 * n / 64), 2 * bm * bn * 64
    if family == "gate_up_wgrad":  # [dW1; dW3]: M = 2n, N = d, k = an expert's slots
        return E * math.ceil(2 * n / bm) * math.ceil(d / bn), math.ceil(slots / 64), 2 * bm * bn * 64
    if family == "down_wgrad":  # dW2: M = d, N = n
        return E * math.ceil(d / bm) * math.ceil(n / bn), math.ceil(slots / 64), 2 * bm * bn * 64
    return None


def fit_line(points):
    """Least squares y = a x + b over (x, y) points; returns (a, b, max relative residual)."""
    n = len(points)
    sx = sum(x for x, _ in points)
    sy = sum(y for _, y in points)
    sxx = sum(x * x for x, _ in points)
    sxy = sum(x * y for x, y in points)
    den = n * sxx - sx * sx
    if den == 0:
        return None
    a = (n * sxy - sx * sy) / den
    b = (sy - a * sx) / n
    resid = max(abs(a * x + b - y) / y for x, y in points)
    return a, b, resid


def tile_costs(results, shapes, sms=132):
    """[(family, tile, overhead_us, step_us, step_tflops, max_resid, [(shape, k_steps, us_per_tile)])]."""
    by_name = {s["name"]: s for s in shapes}
    groups = {}
    for shape_name, report in results.get("kernels", {}).items():
        shape = by_name.get(shape_name)
        if shape is None:
            continue
        for k in report.get("kernels", []):
            if k.get("tile", "-") == "-":
                continue
            family = OLDER_FAMILY.get(k["family"], k["family"])
            bm, bn = tile_dims(k["tile"])
            geo = tile_geometry(family, shape, bm, bn)
            if geo is None:
                continue
            tiles, k_steps, flops = geo
            us_per_tile = k["ms"] * 1e3 * sms / tiles
            groups.setdefault((family, k["tile"]), []).append((shape_name, k_steps, us_per_tile, flops))
    out = []
    for (family, tile), rows in sorted(groups.items()):
        if len({r[1] for r in rows}) < 2 or len(rows) < 3:
            continue  # a line needs at least two depths (and three points to mean anything)
        fit = fit_line([(r[1], r[2]) for r in rows])
        if fit is None:
            continue
        a, b, resid = fit
        flops = rows[0][3]
        step_tflops = flops / (a * 1e-6) * sms / 1e12 if a > 0 else float("inf")
        out.append((family, tile, b, a, step_tflops, resid, [(r[0], r[1], r[2]) for r in rows]))
    return out


def table_lines(rows):
    """The fitted rows as a markdown table."""
    lines = ["| family | tile | overhead us/tile | us/k-step | k-step rate TFLOP/s | max resid | us/tile by shape (k-steps) |",
             "|---|---|---|---|---|---|---|"]
    for family, tile, b, step, tflops, resid, pts in rows:
        by_shape = ", ".join(f"{s} {us:.1f} ({k})" for s, k, us in sorted(pts, key=lambda p: p[1]))
        lines.append(f"| {family} | {tile} | {b:.1f} | {step:.2f} | {tflops:.0f} | {resid:.0%} | {by_shape} |")
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", help="a suite run's results.json")
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--suite", default=str(HERE / "suite.json"))
    a = ap.parse_args(argv)
    if a.sms < 1:
        ap.error(f"--sms: {a.sms} must be at least 1")
    try:
        results = json.loads(pathlib.Path(a.results).read_text())
    except (OSError, ValueError) as e:
        ap.error(f"results: cannot read '{a.results}' as a suite results.json ({e})")
    try:
        shapes = json.loads(pathlib.Path(a.suite).read_text())["shapes"]
    except (OSError, ValueError, KeyError) as e:
        ap.error(f"--suite: cannot read the suite's shapes from '{a.suite}' ({e})")
    if not isinstance(results, dict) or not isinstance(results.get("kernels", {}), dict):
        ap.error(f"results: '{a.results}' has no per-kernel tables (a suite run's results.json has a 'kernels' object)")
    rows = tile_costs(results, shapes, a.sms)
    if not rows:
        print("no (family, tile) ran on three shapes of two depths: nothing to fit")
        return 1
    print("\n".join(table_lines(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
