#!/usr/bin/env python3
"""Reads the Nsight Compute files `tools/gpu_run.sh profile` / `peerprofile` keep under OUT/ncu/,
without a GPU or ncu:

    python3 bench/ncu_source.py kernels NAME_raw.csv.gz [MORE_raw.csv.gz ...]
    python3 bench/ncu_source.py loops NAME_source.csv.gz [--kernel REGEX] [--min-share 0.001]

`kernels`: one line a profiled kernel: duration, tensor pipe active, warp instructions, L2 hit rate
and DRAM bandwidth (the metrics the sections in use report; '-' where a section did not run).
`loops`: per kernel of a SourceCounters report, its hot code: runs of SASS instructions each
executed at least --min-share of the kernel's warp instructions, with their share of the executed
instructions and of the stall samples, the instructions a pass (a loop body: a run whose
instructions execute equally often) and its most-sampled instructions. That is how a mainloop's
k-step cost and where its warps wait are read (docs/performance.md, Open lead 0).
"""
from __future__ import annotations

import argparse
import csv
import gzip
import io
import re
import sys
from pathlib import Path

# Raw-page metrics shown by `kernels`: (column title, metric, the unit it is shown in, format).
RAW_METRICS = [
    ("ms", "gpu__time_duration.sum", "ms", "{:.3f}"),
    ("tensor %", "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active", "%", "{:.1f}"),
    ("instr M", "smsp__inst_executed.sum", "Minst", "{:.0f}"),
    ("L2 hit %", "lts__t_sector_hit_rate.pct", "%", "{:.1f}"),
    ("DRAM TB/s", "dram__bytes.sum.per_second", "Tbyte/s", "{:.2f}"),
]
_PREFIX = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "m": 1e-3, "u": 1e-6, "n": 1e-9}
_TIME = {"s": 1.0, "second": 1.0, "ms": 1e-3, "msecond": 1e-3, "us": 1e-6, "usecond": 1e-6, "ns": 1e-9, "nsecond": 1e-9}


def convert(value: float, unit: str, to: str) -> float | None:
    """`value` in ncu's `unit` expressed in `to` (same kind): Tbyte/s, Gbyte/s, ms, us, %, inst..."""
    def factor(u: str) -> tuple[str, float] | None:
        if u in _TIME:
            return "s", _TIME[u]
        num, _, per = u.partition("/")
        for base in ("byte", "inst", "%"):
            if num.endswith(base) and num[: -len(base)] in _PREFIX:
                f = _PREFIX[num[: -len(base)]]
                if per:
                    if per not in _TIME:
                        return None
                    return f"{base}/s", f / _TIME[per]
                return base, f
        return None
    a, b = factor(unit), factor(to)
    if a is None or b is None or a[0] != b[0]:
        return None
    return value * a[1] / b[1]
SOURCE_EXECUTED = "Instructions Executed"
SOURCE_SAMPLES = "Warp Stall Sampling (All Samples)"


def _open_text(path: Path) -> io.TextIOBase:
    return gzip.open(path, "rt", newline="") if path.suffix == ".gz" else open(path, newline="")


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def read_raw(path: Path) -> list[dict[str, str]]:
    """The raw page (`ncu --page raw --csv`): a header row, a units row, one row a kernel."""
    with _open_text(path) as f:
        rows = list(csv.reader(f))
    if len(rows) < 2 or "Kernel Name" not in rows[0]:
        raise ValueError(f"{path}: not an ncu raw page (no 'Kernel Name' column)")
    header, units = rows[0], rows[1]
    out = []
    for r in rows[2:]:
        if len(r) == len(header):
            row = dict(zip(header, r))
            row["_units"] = dict(zip(header, units))
            out.append(row)
    return out


def kernel_lines(rows: list[dict[str, str]]) -> list[list[str]]:
    out = []
    for r in rows:
        name = r["Kernel Name"]
        cells = [name if len(name) <= 90 else name[:89] + "…"]  # CuTe kernel names run to kilobytes
        for _, metric, unit, fmt in RAW_METRICS:
            v = _number(r.get(metric, ""))
            if v is not None:
                v = convert(v, r["_units"].get(metric, ""), unit)
            cells.append("-" if v is None else fmt.format(v))
        out.append(cells)
    return out


def read_source(path: Path) -> dict[str, list[dict[str, str]]]:
    """The source page (`ncu --page source --print-source sass --csv`): per kernel a 'Kernel Name'
    row, a header row, then one row an instruction, in address order."""
    kernels: dict[str, list[dict[str, str]]] = {}
    name, header = None, None
    with _open_text(path) as f:
        for r in csv.reader(f):
            if not r:
                continue
            if r[0] == "Kernel Name":
                name, header = r[1], None
                kernels[name] = []
            elif r[0] == "Address":
                header = r
            elif name is not None and header is not None:
                kernels[name].append(dict(zip(header, r)))
    if not kernels:
        raise ValueError(f"{path}: no kernel in this source page")
    return kernels


def hot_runs(instrs: list[dict[str, str]], min_share: float, gap: int = 3) -> list[dict]:
    """Runs of instructions each executed at least min_share of the kernel's total and about as
    often as the run's first (within 10%: one loop body), joined across gaps of up to `gap`
    colder instructions."""
    executed = [int(_number(i.get(SOURCE_EXECUTED, "")) or 0) for i in instrs]
    samples = [int(_number(i.get(SOURCE_SAMPLES, "")) or 0) for i in instrs]
    total, total_samples = sum(executed), sum(samples)
    if total == 0:
        return []
    hot = [k for k, n in enumerate(executed) if n >= min_share * total]
    runs: list[list[int]] = []
    for k in hot:
        if runs and k - runs[-1][-1] <= gap + 1 and abs(executed[k] - executed[runs[-1][0]]) <= 0.1 * executed[runs[-1][0]]:
            runs[-1].append(k)
        else:
            runs.append([k])
    out = []
    for run in runs:
        lo, hi = run[0], run[-1]
        span = range(lo, hi + 1)
        passes = max(executed[k] for k in span)
        out.append({
            "first": lo, "last": hi,
            "instructions": len(span),
            "passes": passes,
            "per_pass": sum(executed[k] for k in span) / passes,
            "executed_share": sum(executed[k] for k in span) / total,
            "sample_share": sum(samples[k] for k in span) / total_samples if total_samples else 0.0,
            "top": sorted(((samples[k], instrs[k].get("Source", "").strip()) for k in span), reverse=True)[:3],
        })
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    k = sub.add_parser("kernels", help="one line a kernel of raw pages")
    k.add_argument("raw", nargs="+", type=Path)
    lp = sub.add_parser("loops", help="the hot instruction runs of a source page's kernels")
    lp.add_argument("source", type=Path)
    lp.add_argument("--kernel", default="", help="a regex the kernel names must match")
    lp.add_argument("--min-share", type=float, default=0.001,
                    help="an instruction is hot at this share of the kernel's executed instructions")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "kernels":
            lines = [cells for path in args.raw for cells in kernel_lines(read_raw(path))]  # every file read first
            print("| kernel | " + " | ".join(t for t, *_ in RAW_METRICS) + " |")
            print("|---" * (len(RAW_METRICS) + 1) + "|")
            for cells in lines:
                print("| " + " | ".join(cells) + " |")
            return 0
        if not 0 < args.min_share < 1:
            ap.error("--min-share must be between 0 and 1")
        pattern = re.compile(args.kernel)
        shown = 0
        for name, instrs in read_source(args.source).items():
            if not pattern.search(name):
                continue
            shown += 1
            total = sum(int(_number(i.get(SOURCE_EXECUTED, "")) or 0) for i in instrs)
            print(f"{name}: {total / 1e6:.0f}M warp instructions, {len(instrs)} in the code")
            for r in hot_runs(instrs, args.min_share):
                top = "; ".join(f"{s} x {src}" for s, src in r["top"] if s)
                print(f"  [{r['first']}-{r['last']}] {r['per_pass']:.0f} instructions a pass x {r['passes']}: "
                      f"{100 * r['executed_share']:.1f}% of instructions, {100 * r['sample_share']:.1f}% of samples"
                      + (f"; most sampled: {top}" if top else ""))
        if shown == 0:
            print(f"no kernel matches {args.kernel!r}", file=sys.stderr)
            return 1
        return 0
    except (OSError, ValueError) as e:
        print(f"ncu_source: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
