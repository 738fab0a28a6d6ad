"""Kernel families of one MoE step, for moeblaze and for SonicMoE, from profiler records.

A record is one kernel (or memset/memcpy) run on the GPU: {"name", "us", "phase" ("forward"
or "backward"), "step", "ops" (the enclosing CPU ops, innermost first; empty when the profiler
linked none), "shapes" (the innermost op's input shapes)}. Pure Python: bench/kernels.py makes
the records with torch.profiler, the CPU tests make them by hand.

moeblaze: the generator names every kernel `mb_<family>_E<E>_K<K>_...` (generator/kernel_spec.cpp),
so the family is in the name. SonicMoE: each step of its layer is a torch.library custom op
(sonicmoe/functional: `sonicmoe::_up_projection_forward`, ...), so the enclosing op names the
family; where the profiler linked no op, the QuACK kernel's name does (`GemmGated` = the gated
up-projection, `GemmDGated` = the dSwiGLU GEMM), and the plain GEMMs (`GemmDefault`) go by the
order they run in: down_proj in the forward; down_wgrad, gate_up_dgrad, gate_up_wgrad in the
backward (its autograd runs the down projection's backward first, act then weight, then the up
projection's). Every mapping says how it was made ("name", "op", "order", "none"), and the
raw kernels are always listed, so a wrong guess is visible after the first GPU run."""
from __future__ import annotations

import re
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

# Rows of the comparison, in the order a step runs them.
FAMILIES = ("router", "index_build", "gate_up", "down_proj", "combine", "recompute", "down_dgrad", "gate_grad",
            "down_wgrad", "gate_up_dgrad", "gate_up_wgrad", "bias_grad", "dx_combine", "router_backward", "other")
GEMMS = ("gate_up", "down_proj", "down_dgrad", "down_wgrad", "gate_up_dgrad", "gate_up_wgrad")
DESCRIPTIONS = {
    "router": "router logits GEMM + top-k / gates",
    "index_build": "routing metadata (counts, offsets, gather/scatter indices)",
    "gate_up": "gathered x [W1;W3]^T + SwiGLU epilogue (keeps H)",
    "down_proj": "h W2^T per slot",
    "combine": "gate-weighted sum of a token's K outputs (y)",
    "recompute": "the forward GEMMs rerun in the backward (recompute mode)",
    "down_dgrad": "gathered dy W2 + dSwiGLU epilogue (dH, gate partials)",
    "gate_grad": "gate gradient from the partials",
    "down_wgrad": "dW2",
    "gate_up_dgrad": "per-slot dx = dH [W1;W3]",
    "gate_up_wgrad": "dW1, dW3",
    "bias_grad": "expert biases' gradients (layers with expert biases: GPT-OSS)",
    "dx_combine": "sum of a token's K dx rows",
    "router_backward": "router backward (d logits, dx += d logits W_r, dW_r)",
    "other": "anything else (memsets, autograd's dx accumulation, casts)",
}

_MOEBLAZE_NAME = re.compile(r"^mb_([a-z_]+?)_E\d+_K\d+")
# Families under their older names (docs/design.md, "Glossary"), as kernels built by an older
# revision are named.
_OLDER_FAMILY = {"up_proj": "gate_up", "up_wgrad": "gate_up_wgrad", "up_dgrad": "gate_up_dgrad"}
_MOEBLAZE_FAMILY = {
    "router_logits": "router", "router_topk": "router",
    "index_count": "index_build", "index_scan": "index_build", "index_scatter": "index_build",
    "down_dgrad": "down_dgrad", "gate_grad": "gate_grad", "down_wgrad": "down_wgrad", "gate_up_wgrad": "gate_up_wgrad",
    "gate_up_dgrad": "gate_up_dgrad", "router_backward": "router_backward", "router_dgrad": "router_backward",
    "router_wgrad": "router_backward", "bias_grad": "bias_grad", "gate_bias_grad": "gate_grad",
}


def moeblaze_family(name: str, phase: str) -> Tuple[str, str]:
    """(family, how) of a moeblaze kernel; non-moeblaze kernels (memsets, torch ops) are 'other'."""
    m = _MOEBLAZE_NAME.match(name)
    if not m:
        return "other", "none"
    fam = _OLDER_FAMILY.get(m.group(1), m.group(1))
    if fam in ("gate_up", "down_proj"):
        return (fam if phase == "forward" else "recompute"), "name"
    if fam == "combine":
        return ("combine" if phase == "forward" else "dx_combine"), "name"
    return _MOEBLAZE_FAMILY.get(fam, "other"), "name"


# SonicMoE's custom ops (sonicmoe/functional/{forward,backward}.py, triton_kernels/__init__.py).
_SONIC_OPS = {
    "sonicmoe::_topk_fwd": "router", "sonicmoe::_softmax_topk_fwd": "router",
    "triton_kernels::TC_topk_router_metadata": "index_build",
    "triton_kernels::general_routing_router_metadata": "index_build",
    "sonicmoe::_up_projection_forward": "gate_up",
    "sonicmoe::_down_projection_forward": "down_proj",
    "sonicmoe::_router_forward": "combine",
    "sonicmoe::_down_projection_backward_act": "down_dgrad",
    "sonicmoe::_down_projection_backward_weight": "down_wgrad",
    "sonicmoe::_up_projection_backward_act": "gate_up_dgrad",
    "sonicmoe::_up_projection_backward_weight": "gate_up_wgrad",
    "sonicmoe::_token_broadcast_backward": "dx_combine",
    "sonicmoe::_topk_softmax_bwd": "router_backward", "sonicmoe::_topk_bwd": "router_backward",
}
# Its autograd functions (forward: the class name; backward: "<class>Backward"), for the
# kernels launched outside the custom ops (the router's dlogits zeros, index/scatter of scores).
_SONIC_FUNCTIONS = (("TC_Softmax_Topk_Router_Function", "router", "router_backward"),)
_TORCH_GEMM_OPS = ("aten::mm", "aten::addmm", "aten::linear", "aten::matmul", "aten::bmm")

# QuACK's kernel names (CuTe DSL: kernel_cutlass_kernel_quackgemm_<epilogue><Class>Sm90_...);
# case-sensitive, so that cuBLAS names (sm90_xmma_gemm_...) never match.
_QUACK_DGATED = re.compile(r"GemmDGated|quackgemm_dact")
_QUACK_GATED = re.compile(r"GemmGated|quackgemm_act")
_QUACK_GEMM = re.compile(r"quackgemm|Gemm[A-Za-z]*Sm90")
_CUBLAS_GEMM = re.compile(r"^(nvjet|sm90_xmma|sm80_xmma|ampere_|cutlass)|gemm", re.I)
_SONIC_NAMES = (  # Triton / CuTe kernels of SonicMoE outside the GEMMs, by name
    (re.compile(r"token_gather_sum|gather_and_sum"), ("combine", "dx_combine")),
    (re.compile(r"softmax_over_topk_bwd|topk_over_softmax_bwd|topk_bwd"), ("router_backward", "router_backward")),
    (re.compile(r"col_partial_sum|metadata_compute|searchsorted|bitmatrix"), ("index_build", "index_build")),
    (re.compile(r"db2_and_ds"), ("gate_grad", "gate_grad")),
    (re.compile(r"topk|TopK|softmax_fwd"), ("router", "router_backward")),
)
BACKWARD_PLAIN_GEMMS = ("down_wgrad", "gate_up_dgrad", "gate_up_wgrad")


def is_quack_gemm(name: str) -> bool:
    return bool(_QUACK_GEMM.search(name) or _QUACK_GATED.search(name))


def sonicmoe_family(name: str, ops: Sequence[str], phase: str, plain_gemm_index: int) -> Tuple[str, str]:
    """(family, how) of a SonicMoE kernel. `plain_gemm_index`: how many plain QuACK GEMMs ran
    before this one in the same phase of the same step (for the order fallback)."""
    fwd = phase == "forward"
    for op in ops:  # innermost first: the nearest known op decides
        fam = _SONIC_OPS.get(op)
        if fam:
            # The dSwiGLU op also gathers the scores and scatters ds: that is gate-gradient work.
            if fam == "down_dgrad" and not is_quack_gemm(name):
                return "gate_grad", "op"
            return fam, "op"
        for cls, f_fam, b_fam in _SONIC_FUNCTIONS:
            if op == cls or op.endswith(cls + "Backward") or (cls + "Backward") in op:
                return (f_fam if fwd else b_fam), "op"
    if any(op in _TORCH_GEMM_OPS for op in ops) and not is_quack_gemm(name):
        return ("router" if fwd else "router_backward"), "op"  # the router's F.linear and its backward
    if _QUACK_DGATED.search(name):
        return "down_dgrad", "name"
    if _QUACK_GATED.search(name):
        return "gate_up", "name"
    if _QUACK_GEMM.search(name):
        if fwd:
            return ("down_proj" if plain_gemm_index == 0 else "other"), "order"
        if plain_gemm_index < len(BACKWARD_PLAIN_GEMMS):
            return BACKWARD_PLAIN_GEMMS[plain_gemm_index], "order"
        return "other", "order"
    for pattern, (f_fam, b_fam) in _SONIC_NAMES:
        if pattern.search(name):
            return (f_fam if fwd else b_fam), "name"
    if _CUBLAS_GEMM.search(name):
        return ("router" if fwd else "router_backward"), "name"
    return "other", "none"


def assign(records: Iterable[dict], impl: str) -> List[dict]:
    """The records in order with "family" and "how" added. Records must be in run order
    within each (step, phase) for SonicMoE's order fallback."""
    out = []
    plain: Dict[tuple, int] = {}
    for r in records:
        r = dict(r)
        if impl == "sonicmoe":
            key = (r.get("step", 0), r["phase"])
            r["family"], r["how"] = sonicmoe_family(r["name"], r.get("ops", ()), r["phase"], plain.get(key, 0))
            if _QUACK_GEMM.search(r["name"]) and not _QUACK_GATED.search(r["name"]) and not _QUACK_DGATED.search(r["name"]):
                plain[key] = plain.get(key, 0) + 1
        elif impl.startswith("moeblaze"):
            r["family"], r["how"] = moeblaze_family(r["name"], r["phase"])
        else:
            r["family"], r["how"] = "other", "none"
        out.append(r)
    return out


def _median(values: Sequence[float]) -> float:
    v = sorted(values)
    return v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2


def family_ms(assigned: Sequence[dict]) -> Dict[str, float]:
    """ms per step of each family (the median over the profiled steps; a family absent from a
    step counts 0 there), plus "gemms" (the six GEMM families) and "total"."""
    steps = sorted({r.get("step", 0) for r in assigned})
    sums: List[Dict[str, float]] = []
    for s in steps:
        step: Dict[str, float] = {}
        for r in assigned:
            if r.get("step", 0) == s:
                step[r["family"]] = step.get(r["family"], 0.0) + r["us"] / 1000
        step["gemms"] = sum(v for k, v in step.items() if k in GEMMS)
        step["total"] = sum(v for k, v in step.items() if k in FAMILIES)
        sums.append(step)
    names = {k for step in sums for k in step}
    return {k: _median([step.get(k, 0.0) for step in sums]) for k in names}


def op_label(ops: Sequence[str]) -> str:
    """The op worth showing for a kernel: the innermost one of a layer's own namespace
    (sonicmoe::, triton_kernels::, moeblaze::), else the innermost op, else "-"."""
    for op in ops:
        if op.startswith(("sonicmoe::", "triton_kernels::", "moeblaze::")):
            return op
    return ops[0] if ops else "-"


def top_kernels(assigned: Sequence[dict], n: int = 25) -> List[dict]:
    """The n kernels with the most time per step, by (name, phase): calls and ms per step,
    family, how it was mapped, the op it ran in (op_label) and the innermost op's input shapes."""
    steps = max(1, len({r.get("step", 0) for r in assigned}))
    rows: Dict[tuple, dict] = {}
    for r in assigned:
        key = (r["name"], r["phase"])
        row = rows.setdefault(key, {"name": r["name"], "phase": r["phase"], "family": r["family"], "how": r["how"],
                                    "op": op_label(r.get("ops") or []), "shapes": r.get("shapes"), "us": 0.0,
                                    "calls": 0})
        row["us"] += r["us"]
        row["calls"] += 1
    out = sorted(rows.values(), key=lambda x: -x["us"])[:n]
    for row in out:
        row["ms_per_step"] = row.pop("us") / 1000 / steps
        row["calls_per_step"] = row.pop("calls") / steps
    return out


def comparison(ours: Dict[str, float], theirs: Optional[Dict[str, float]]) -> List[dict]:
    """Rows family / moeblaze ms / SonicMoE ms / ratio (SonicMoE / moeblaze: > 1 means
    moeblaze's kernels are faster), for every family that either ran, then GEMMs and total."""
    theirs = theirs or {}
    rows = []
    for fam in FAMILIES + ("gemms", "total"):
        a, b = ours.get(fam, 0.0), theirs.get(fam, 0.0)
        if fam in FAMILIES and a == 0 and b == 0:
            continue
        rows.append({"family": fam, "moeblaze_ms": a, "sonicmoe_ms": b if theirs else None,
                     "ratio": (b / a) if (theirs and a > 0 and b > 0) else None})
    return rows


def short(name: str, width: int = 110) -> str:
    """A kernel name cut for a table cell (CuTe names run to hundreds of characters)."""
    name = name.replace("|", "/")
    return name if len(name) <= width else name[:width - 3] + "..."


def render(result: dict) -> str:
    """kernels.md: the family table, then each impl's top kernels."""
    shape = result["shape"]
    lines = [f"# Per-kernel comparison: {shape['name']} (E={shape['E']} K={shape['K']} d={shape['d']} n={shape['n']} "
             f"T={result['tokens']}), {result.get('device', '')}", "",
             f"GPU time per step from torch.profiler (CUDA kernels, memsets and copies), median of "
             f"{result['steps']} profiled steps after warm-up; forward and backward profiled separately. "
             "ratio = SonicMoE ms / moeblaze ms: above 1 moeblaze's kernels are faster.", ""]
    for impl, why in result.get("errors", {}).items():
        lines.append(f"**{impl} did not run:** {why}\n")
    sonic = result["impls"].get("sonicmoe")
    ours = result["impls"].get("moeblaze")
    if ours:
        lines += ["| family | what | moeblaze ms | SonicMoE ms | ratio |", "|---|---|---|---|---|"]
        for row in comparison(ours["family_ms"], sonic["family_ms"] if sonic else None):
            b = f"{row['sonicmoe_ms']:.3f}" if row["sonicmoe_ms"] is not None else "-"
            ratio = f"{row['ratio']:.2f}x" if row["ratio"] is not None else "-"
            what = DESCRIPTIONS.get(row["family"], "the six GEMM families" if row["family"] == "gemms" else "every kernel")
            label = f"**{row['family']}**" if row["family"] in ("gemms", "total") else row["family"]
            lines.append(f"| {label} | {what} | {row['moeblaze_ms']:.3f} | {b} | {ratio} |")
        lines.append("")
    for impl, data in result["impls"].items():
        hows = {}
        for k in data["top"]:
            hows[k["how"]] = hows.get(k["how"], 0) + 1
        lines += [f"## {impl}: top kernels ({data['kernels_per_step']:.0f} kernels a step, "
                  f"{data['family_ms'].get('total', 0):.3f} ms; step by events {data.get('step_ms', 0):.2f} ms)", "",
                  "How mapped: name = the kernel's name, op = the enclosing custom op, order = the n-th plain GEMM "
                  "of its phase, none = not recognised.", "",
                  "| kernel | phase | family | how | op | calls | ms/step |", "|---|---|---|---|---|---|---|"]
        for k in data["top"]:
            lines.append(f"| `{short(k['name'])}` | {k['phase']} | {k['family']} | {k['how']} | {short(k['op'], 50)} | "
                         f"{k['calls_per_step']:.0f} | {k['ms_per_step']:.3f} |")
        lines.append("")
    return "\n".join(lines) + "\n"
