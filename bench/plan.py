"""What one suite invocation runs, and about how long it takes: the cases (shape, routing,
tokens, implementation) in the order suite.py runs them, the --quick subset, and a time
estimate from the step times of earlier H200 runs (docs/performance.md). Pure
Python: no torch, no GPU, so `suite.py --dry-run` and the CPU tests can use it.

Order: every shape's random routing first, then skewed, then the token sweep, so that a
deadline (--deadline-s) cuts the least important cases."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

HERE = Path(__file__).resolve().parent
SUITE = json.loads((HERE / "suite.json").read_text())["shapes"]
SHAPES = {s["name"]: s for s in SUITE}
# The held-out shapes (bench/heldout.json): runnable by name (--shapes qwen1.5-moe), never in a
# default run.
HELDOUT = {s["name"]: s for s in json.loads((HERE / "heldout.json").read_text())["shapes"]}
ALL_SHAPES = {**SHAPES, **HELDOUT}

MOEBLAZE_IMPLS = ("moeblaze", "moeblaze-recompute")
PEER_IMPLS = ("sonicmoe", "megablocks")  # run from a copy of shared/peers/<name> (bench/peers.py)
TORCH_IMPLS = ("torch-grouped_mm", "torch-loop")  # bench/baselines.py
IMPLS = MOEBLAZE_IMPLS + PEER_IMPLS + TORCH_IMPLS
ROUTINGS = ("random", "skewed")
SWEEP_TOKENS = (4096, 8192, 16384, 32768, 65536)
# The loop over experts costs a launch chain per expert whatever T is (~250 ms a step on
# qwen3-30b-a3b at every T of the 2026-11-30 sweep): it stays out of the sweep unless asked for.
DEFAULT_SWEEP_IMPLS = tuple(i for i in IMPLS if i != "torch-loop")
TORCH_LOOP_MAX_EXPERTS = 255  # minutes per step beyond: left out

QUICK = {"shapes": ("qwen3-30b-a3b", "gpt-oss-20b"), "routing": ("random",), "impls": ("moeblaze", "sonicmoe")}


@dataclass(frozen=True)
class Case:
    shape: str
    routing: str
    tokens: int
    impl: str


def parse_list(value: str, allowed: Sequence[str], what: str) -> List[str]:
    """Comma list checked against `allowed`; ValueError naming the option and the bad names."""
    names = [v for v in value.split(",") if v]
    unknown = [v for v in names if v not in allowed]
    if unknown:
        raise ValueError(f"{what}: unknown {unknown} (known: {', '.join(allowed)})")
    if not names:
        raise ValueError(f"{what}: empty")
    return names


def cases(shapes: Sequence[str], routings: Sequence[str], impls: Sequence[str], sweep_shapes: Sequence[str] = (),
          sweep_impls: Sequence[str] = DEFAULT_SWEEP_IMPLS) -> List[Case]:
    """The cases in run order: each routing over every shape at its suite T, then the sweep
    (random routing) on the sweep shapes that are also in `shapes`, with the impls of both
    `impls` and `sweep_impls`. torch-loop is left out where E > TORCH_LOOP_MAX_EXPERTS."""
    out: List[Case] = []

    def add(name, routing, T, names):
        for impl in names:
            if impl == "torch-loop" and ALL_SHAPES[name]["E"] > TORCH_LOOP_MAX_EXPERTS:
                continue
            out.append(Case(name, routing, T, impl))

    for routing in routings:
        for name in shapes:
            add(name, routing, ALL_SHAPES[name]["T"], impls)
    swept = [i for i in impls if i in sweep_impls]
    for name in sweep_shapes:
        if name not in shapes:
            continue
        for T in SWEEP_TOKENS:
            if T != ALL_SHAPES[name]["T"]:
                add(name, "random", T, swept)
    return out


# Step and forward ms at the suite T on an H200 (docs/performance.md: the latest suite run for
# moeblaze and the torch baselines, the current standing for the peers, whose forward is taken
# as a third of the step). Only for the estimate: a shape or impl missing here is estimated
# from the slowest known impl.
KNOWN_MS: Dict[str, Dict[str, tuple]] = {
    "mixtral-8x7b": {"moeblaze": (20.2, 64.2), "moeblaze-recompute": (19.2, 76.2), "sonicmoe": (18.0, 53.8),
                     "megablocks": (18.4, 55.2), "torch-grouped_mm": (21.2, 60.7), "torch-loop": (21.2, 80.3)},
    "gpt-oss-20b": {"moeblaze": (5.5, 19.7), "moeblaze-recompute": (5.6, 23.2), "sonicmoe": (5.8, 17.5),
                    "megablocks": (6.5, 19.6), "torch-grouped_mm": (10.0, 24.4), "torch-loop": (18.3, 88.1)},
    "olmoe-1b-7b": {"moeblaze": (6.8, 20.8), "moeblaze-recompute": (6.4, 24.5), "sonicmoe": (5.7, 17.2),
                    "megablocks": (7.6, 22.7), "torch-grouped_mm": (16.8, 35.5), "torch-loop": (31.6, 120.8)},
    "qwen3-30b-a3b": {"moeblaze": (5.7, 16.8), "moeblaze-recompute": (5.3, 19.4), "sonicmoe": (4.6, 13.7),
                      "megablocks": (7.3, 21.8), "torch-grouped_mm": (16.0, 32.7), "torch-loop": (56.3, 267.0)},
    "deepseek-v3": {"moeblaze": (24.2, 75.7), "moeblaze-recompute": (23.9, 89.4), "sonicmoe": (24.5, 73.5),
                    "megablocks": (26.4, 79.2), "torch-grouped_mm": (40.5, 100.1)},
    "qwen3-next-80b": {"moeblaze": (5.9, 17.2), "moeblaze-recompute": (5.7, 19.7), "sonicmoe": (4.6, 13.7),
                       "megablocks": (23.6, 70.8), "torch-grouped_mm": (20.2, 40.7)},
}
# One case = a first step, (3 warm-up + 10) forwards, (3 + 10) steps, one forward for the
# activations and two steps for the peak (suite.py measure_case), plus ~0.6 s of set-up (run
# 12: 195 s for 72 cases whose GPU work adds up to 112 s, with six CLI breakdowns of ~5 s).
STEPS_PER_CASE, FORWARDS_PER_CASE, CASE_OVERHEAD_S = 16, 14, 0.6
BREAKDOWN_S = 5.0  # `moeblaze bench --json` per shape (random routing, suite T)
START_S = 12.0  # python, torch and CUDA start, the GEMM and copy ceilings
PEER_FIRST_USE_S = {"sonicmoe": 20.0, "megablocks": 15.0}  # unpack + import (+ MegaBlocks' smoke test)
SONIC_AUTOTUNE_S = 8.0  # QuACK's autotuner on each new problem (shape, T); cached afterwards
MOEBLAZE_COMPILE_S = 10.0  # NVRTC on a cold MOEBLAZE_CACHE, per shape (parallel compiles); ~0 when warm
KERNEL_COMPARE_S = 15.0  # bench/kernels.py on one shape: profiler start-up and 2 x 3 profiled steps


def case_seconds(case: Case) -> float:
    known = KNOWN_MS.get(case.shape, {})
    fwd, step = known.get(case.impl) or max(known.values(), key=lambda v: v[1], default=(30.0, 100.0))
    scale = case.tokens / ALL_SHAPES[case.shape]["T"]
    return CASE_OVERHEAD_S + scale * (STEPS_PER_CASE * step + FORWARDS_PER_CASE * fwd) / 1000


def estimate_seconds(plan: Sequence[Case], kernel_shapes: Sequence[str] = ()) -> Dict[str, float]:
    """Seconds by part (start, cases, breakdowns, moeblaze's compiles, peers, kernels) and their total."""
    parts = {"start": START_S, "cases": sum(case_seconds(c) for c in plan)}
    parts["breakdowns"] = BREAKDOWN_S * len({c.shape for c in plan if c.impl.startswith("moeblaze")
                                             and c.routing == "random" and c.tokens == ALL_SHAPES[c.shape]["T"]})
    used = {c.impl for c in plan}
    sonic_problems = {(c.shape, c.tokens) for c in plan if c.impl == "sonicmoe"}
    if kernel_shapes:
        used.add("sonicmoe")
        sonic_problems |= {(s, ALL_SHAPES[s]["T"]) for s in kernel_shapes}
    parts["compile"] = MOEBLAZE_COMPILE_S * len({c.shape for c in plan if c.impl.startswith("moeblaze")})
    parts["peers"] = sum(PEER_FIRST_USE_S[p] for p in PEER_IMPLS if p in used) + SONIC_AUTOTUNE_S * len(sonic_problems)
    parts["kernels"] = KERNEL_COMPARE_S * len(kernel_shapes)
    parts["total"] = sum(parts.values())
    return parts


def describe(plan: Sequence[Case], kernel_shapes: Sequence[str] = (), deadline_s: Optional[float] = None) -> str:
    """The plan as text: cases per (routing, tokens) group and the estimate by part."""
    lines = []
    groups: Dict[tuple, List[Case]] = {}
    for c in plan:
        groups.setdefault((c.shape, c.routing, c.tokens), []).append(c)
    for (shape, routing, T), cs in groups.items():
        secs = sum(case_seconds(c) for c in cs)
        lines.append(f"{shape:16s} {routing:7s} T={T:<6d} {','.join(c.impl for c in cs)}  ~{secs:.0f} s")
    est = estimate_seconds(plan, kernel_shapes)
    lines.append(f"{len(plan)} cases; estimate on an H200: " + ", ".join(f"{k} {v:.0f} s" for k, v in est.items()))
    if kernel_shapes:
        lines.append(f"per-kernel comparison on {', '.join(kernel_shapes)}")
    if deadline_s is not None and est["total"] > deadline_s:
        lines.append(f"the estimate is past --deadline-s {deadline_s:.0f}: the last cases will be skipped")
    return "\n".join(lines)
