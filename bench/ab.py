#!/usr/bin/env python3
"""A/B of tile choices with `moeblaze bench`, the way a kernel change is judged before it becomes a
default: each preset's default tiles and every variant, run in alternating rounds in one call
(A B C A B C ..., so drift in clocks or temperature falls on all of them alike), optionally after
a grad-check of the defaults and each variant; then the median step and per-kernel ms of each,
and each variant's ratio to the defaults.

    python3 bench/ab.py --preset qwen3-30b-a3b --preset mixtral-8x7b \\
        --variant tmastore="down_proj=128x256x64_w8x1_s3_persist_tmacontig_tmastore gate_up_dgrad=..." \\
        [--rounds 2] [--grad-check-tokens 4096] [--no-check NAME] [--json ab.json] [--deadline-s 300]

A variant is NAME=TILES, TILES a space- or comma-separated list of FAMILY=TILE (what `moeblaze
bench --tile` takes). A tile that is not legal for a preset's layer is reported and that variant
skipped on that preset. --derive NAME=SUFFIX makes a variant per preset from its default tiles
(`moeblaze generate -T <the preset's T> --check-only --json`, the tiles `bench` runs): each
warp-specialised tile with SUFFIX appended where the result is legal, e.g. --derive
direct=_directarrive. --build NAME=PATH is a variant that runs another build's `moeblaze` (PATH)
with its own default tiles: a template change judged against the build before it, on the same
GPU in the same rounds. --grad-check-tokens checks the defaults ("default": the build under test)
and every variant first; a failing variant is dropped, failing defaults drop the preset (nothing
to compare with). --no-check NAME leaves one out, e.g. an earlier build checked before: a
deepseek-v3 check costs about as much as two bench rounds. The table shows the step and the families any variant changes; "ratio"
is default ms / variant ms (above 1 the variant is faster). Needs a GPU and a built `moeblaze`
(--moeblaze, default build/bin/moeblaze).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

DEFAULT = "default"


def parse_variant(text: str) -> tuple[str, list[str]]:
    """"NAME=FAM=TILE FAM=TILE" (or commas) -> (NAME, ["FAM=TILE", ...])."""
    name, sep, rest = text.partition("=")
    tiles = [t for t in rest.replace(",", " ").split() if t]
    if not sep or not name or name == DEFAULT or not tiles:
        raise ValueError(f"variant '{text}': expected NAME=FAMILY=TILE [FAMILY=TILE ...], NAME not '{DEFAULT}'")
    for t in tiles:
        family, eq, tile = t.partition("=")
        if not eq or not family or not tile:
            raise ValueError(f"variant '{name}': '{t}' is not FAMILY=TILE")
    return name, tiles


def parse_build(text: str) -> tuple[str, str]:
    """"NAME=PATH" -> (NAME, PATH): another build's moeblaze binary."""
    name, sep, path = text.partition("=")
    if not sep or not name or name == DEFAULT or not path:
        raise ValueError(f"build '{text}': expected NAME=PATH (a moeblaze binary), NAME not '{DEFAULT}'")
    return name, path


def parse_derive(text: str) -> tuple[str, str]:
    """"NAME=SUFFIX" -> (NAME, SUFFIX); SUFFIX starts with "_"."""
    name, sep, suffix = text.partition("=")
    if not sep or not name or name == DEFAULT or not suffix.startswith("_") or "=" in suffix:
        raise ValueError(f"derive '{text}': expected NAME=_SUFFIX, NAME not '{DEFAULT}'")
    return name, suffix


WARP_SPECIALISED = ("_ws", "_persist", "_pingpong")


def derived_tiles(defaults: dict[str, str], suffix: str) -> list[str]:
    """FAMILY=TILE+SUFFIX for each warp-specialised default tile (legality is checked later)."""
    return [f"{f}={t}{suffix}" for f, t in defaults.items()
            if any(f"{m}_" in t + "_" for m in WARP_SPECIALISED)]


def schedule(plan: dict[str, dict[str, list[str]]], rounds: int) -> list[tuple[str, str, int]]:
    """The order of the bench runs: per preset, `rounds` rounds of the default and every variant."""
    return [(p, v, r) for p, variants in plan.items() for r in range(rounds) for v in [DEFAULT, *variants]]


def summarize(runs: list[dict]) -> dict:
    """runs: {"preset", "variant", "step_ms", "kernels": {family: (ms, tile)}} -> per preset and
    variant the median step and per-family ms, the tiles, and ratios to the default."""
    out: dict = {}
    for r in runs:
        v = out.setdefault(r["preset"], {}).setdefault(r["variant"], {"steps": [], "kernels": {}, "tiles": {}})
        v["steps"].append(r["step_ms"])
        for family, (ms, tile) in r["kernels"].items():
            v["kernels"].setdefault(family, []).append(ms)
            v["tiles"][family] = tile
    for variants in out.values():
        for v in variants.values():
            v["step_ms"] = statistics.median(v["steps"])
            v["kernel_ms"] = {f: statistics.median(ms) for f, ms in v["kernels"].items()}
        base = variants.get(DEFAULT)
        for name, v in variants.items():
            if base is None or name == DEFAULT:
                continue
            v["step_ratio"] = base["step_ms"] / v["step_ms"]
            v["kernel_ratio"] = {f: base["kernel_ms"][f] / ms for f, ms in v["kernel_ms"].items()
                                 if f in base["kernel_ms"] and ms > 0}
    return out


def changed_families(variants: dict) -> list[str]:
    """Families whose tile differs from the default's in some variant, in the default's order."""
    base = variants.get(DEFAULT, {}).get("tiles", {})
    changed = {f for name, v in variants.items() if name != DEFAULT for f, t in v["tiles"].items() if base.get(f) != t}
    return [f for f in base if f in changed]


def table(summary: dict, every_family: bool = False) -> str:
    """every_family: a column per kernel family (another build's kernels differ under the same tiles)."""
    lines = []
    for preset, variants in summary.items():
        fams = list(variants.get(DEFAULT, {}).get("tiles", {})) if every_family else changed_families(variants)
        lines += [f"### {preset}", "", "| variant | step ms | ratio | " + " | ".join(f"{f} ms" for f in fams) + " |",
                  "|---|---|---|" + "---|" * len(fams)]
        for name, v in variants.items():
            ratio = "" if name == DEFAULT else f"{v.get('step_ratio', 0):.3f}x"
            cells = []
            for f in fams:
                ms = v["kernel_ms"].get(f)
                r = v.get("kernel_ratio", {}).get(f)
                cells.append("-" if ms is None else f"{ms:.3f}" + (f" ({r:.3f}x)" if r else ""))
            runs = len(v["steps"])
            lines.append(f"| {name} | {v['step_ms']:.2f} (n={runs}) | {ratio} | " + " | ".join(cells) + " |")
        lines.append("")
        for name, v in variants.items():
            tiles = ", ".join(f"{f}={v['tiles'][f]}" for f in fams if f in v["tiles"])
            if tiles:
                lines.append(f"- {name}: {tiles}")
        lines.append("")
    return "\n".join(lines)


def presets_tokens(moeblaze: str) -> dict[str, int]:
    out = subprocess.run([moeblaze, "presets", "--json"], capture_output=True, text=True, check=True).stdout
    return {p["name"]: p["T"] for p in json.loads(out)}


def default_tiles(moeblaze: str, preset: str, tokens: int) -> dict[str, str]:
    out = subprocess.run([moeblaze, "generate", "--preset", preset, "-T", str(tokens), "--check-only", "--json"],
                         capture_output=True, text=True, check=True).stdout
    return {k["family"]: k["tile"] for k in json.loads(out)["kernels"] if k["tile"] != "-"}


def legal(moeblaze: str, preset: str, tiles: list[str]) -> str:
    """'' when every FAMILY=TILE is legal for the preset's layer, else moeblaze's reason."""
    p = subprocess.run([moeblaze, "generate", "--preset", preset, "--check-only", *(["--tile", *tiles] if tiles else [])],
                       capture_output=True, text=True)
    return "" if p.returncode == 0 else (p.stderr.strip() or p.stdout.strip())[-300:]


def bench_args(preset: str, tiles: list[str]) -> list[str]:
    return ["bench", "--preset", preset, "--json"] + (["--tile", *tiles] if tiles else [])


def run_bench(moeblaze: str, preset: str, tiles: list[str], timeout: float) -> dict:
    p = subprocess.run([moeblaze, *bench_args(preset, tiles)], capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"bench {preset} {' '.join(tiles)}: exit {p.returncode}: {p.stderr.strip()[-400:]}")
    d = json.loads(p.stdout)
    return {"step_ms": d["step_ms"], "kernels": {k["family"]: (k["ms"], k["tile"]) for k in d["kernels"]}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", action="append", required=True, help="a preset (repeat for more)")
    ap.add_argument("--variant", action="append", default=[], help="NAME=FAMILY=TILE [FAMILY=TILE ...] (repeat)")
    ap.add_argument("--derive", action="append", default=[],
                    help="NAME=_SUFFIX: each preset's warp-specialised default tiles with _SUFFIX (repeat)")
    ap.add_argument("--build", action="append", default=[],
                    help="NAME=PATH: another build's moeblaze binary, run with its default tiles (repeat)")
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds (default 2)")
    ap.add_argument("--grad-check-tokens", type=int, default=0,
                    help="grad-check each variant at this T first (0: no check); a failing variant is dropped")
    ap.add_argument("--no-check", action="append", default=[],
                    help="NAME: no grad-check for this variant ('default' for the defaults; repeat)")
    ap.add_argument("--moeblaze", default="build/bin/moeblaze")
    ap.add_argument("--deadline-s", type=float, default=0, help="start nothing after this many seconds (0: none)")
    ap.add_argument("--json", type=Path, help="write the runs and the summary here")
    args = ap.parse_args(argv)
    try:
        variants = dict(parse_variant(v) for v in args.variant)
        derives = dict(parse_derive(d) for d in args.derive)
        builds = dict(parse_build(b) for b in args.build)
    except ValueError as e:
        ap.error(str(e))
    names = [*variants, *derives, *builds]
    if len(set(names)) != len(names):
        ap.error(f"names used twice: {sorted({n for n in names if names.count(n) > 1})}")
    for name, path in builds.items():
        if not Path(path).is_file():
            ap.error(f"--build {name}={path}: no such file")
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    if args.grad_check_tokens < 0:
        ap.error("--grad-check-tokens must be 0 (no check) or positive")
    unnamed = [n for n in args.no_check if n != DEFAULT and n not in names]
    if unnamed:
        ap.error(f"--no-check: no variant named {unnamed}")
    if args.deadline_s < 0:
        ap.error("--deadline-s must be 0 (none) or positive")
    try:
        tokens = presets_tokens(args.moeblaze)
    except (OSError, subprocess.CalledProcessError) as e:
        ap.error(f"--moeblaze {args.moeblaze}: cannot list the presets ({e})")
    unknown = [p for p in args.preset if p not in tokens]
    if unknown:
        ap.error(f"--preset: unknown {unknown}; known: {sorted(tokens)}")
    start = time.monotonic()

    def time_left() -> float:
        return float("inf") if args.deadline_s <= 0 else args.deadline_s - (time.monotonic() - start)

    def binary(name: str) -> str:
        return builds.get(name, args.moeblaze)

    plan: dict[str, dict[str, list[str]]] = {}
    for preset in args.preset:
        plan[preset] = dict(variants)
        plan[preset].update({name: [] for name in builds})
        if derives:
            defaults = default_tiles(args.moeblaze, preset, tokens[preset])
            for name, suffix in derives.items():  # the legal families of the derived tiles
                plan[preset][name] = [t for t in derived_tiles(defaults, suffix) if not legal(args.moeblaze, preset, [t])]
    def grad_check(preset: str, name: str, tiles: list[str]) -> bool:
        """Whether the variant passes (or is not to be checked)."""
        if args.grad_check_tokens <= 0 or name in args.no_check or time_left() <= 10:
            return True
        tile_args = ["--tile", *tiles] if tiles else []
        try:
            gc = subprocess.run([binary(name), "grad-check", "--preset", preset, "-T", str(args.grad_check_tokens),
                                 *tile_args], capture_output=True, text=True, timeout=min(600, time_left()))
        except subprocess.TimeoutExpired as e:
            # An unfinished check is not a pass: the variant is dropped and the run goes on
            # with what was checked (a deepseek-v3 check costs about a minute on the H200 host).
            print(f"{preset} {name}: grad-check T={args.grad_check_tokens}: not finished within the deadline "
                  f"({e.timeout:.0f} s); variant dropped", flush=True)
            return False
        verdict = next((ln for ln in gc.stdout.splitlines() if ln.startswith(("PASS", "FAIL"))), "no verdict")
        print(f"{preset} {name}: grad-check T={args.grad_check_tokens}: {verdict}", flush=True)
        return gc.returncode == 0

    dropped: set[tuple[str, str]] = set()
    for preset, named in plan.items():
        if not grad_check(preset, DEFAULT, []):
            print(f"{preset}: the defaults fail their grad-check; nothing run on this preset", flush=True)
            dropped.update((preset, name) for name in [DEFAULT, *named])
            continue
        for name, tiles in named.items():
            if tiles or name in builds:
                why = legal(binary(name), preset, tiles)
            else:
                why = "no tile of this variant applies"
            if why:
                print(f"{preset} {name}: not legal: {why}", flush=True)
                dropped.add((preset, name))
                continue
            if not grad_check(preset, name, tiles):
                dropped.add((preset, name))
    runs = []
    for preset, name, rnd in schedule(plan, args.rounds):
        if (preset, name) in dropped:
            continue
        if time_left() < 10:
            print(f"deadline: {preset} {name} round {rnd} not run", flush=True)
            continue
        try:
            r = run_bench(binary(name), preset, plan[preset].get(name, []), timeout=min(300, time_left()))
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            print(f"{preset} {name} round {rnd}: {e}", flush=True)
            continue
        runs.append({"preset": preset, "variant": name, "round": rnd, **r})
        print(f"{preset} {name} round {rnd}: step {r['step_ms']:.2f} ms", flush=True)
    summary = summarize(runs)
    print(table(summary, every_family=bool(builds)))
    if args.json:
        args.json.write_text(json.dumps({"variants": plan, "builds": builds, "runs": runs, "summary": summary}, indent=1))
    return 0 if runs else 1


if __name__ == "__main__":
    sys.exit(main())
