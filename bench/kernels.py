"""Per-kernel comparison on one shape: one step of moeblaze (save-h) and of SonicMoE under
torch.profiler (CUDA activities), device time summed per kernel and mapped to moeblaze's GEMM
families (bench/kernel_families.py says how), median over a few profiled steps. Forward and
backward are profiled separately so that each kernel's phase is known. Writes kernels.md (the
family table and each impl's top kernels) and kernels.json (every number) under --out.

Usage: python3 bench/kernels.py [--shapes qwen3-30b-a3b] [--tokens T] [--steps 3] [--peers DIR]
           [--impls moeblaze,sonicmoe] [--forward-only] --out DIR
(needs a GPU; suite.py --kernels runs the same in the suite's process)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python"))
sys.path.insert(0, str(HERE))
import kernel_families as kf  # noqa: E402
from plan import SHAPES  # noqa: E402

IMPLS = ("moeblaze", "sonicmoe")
_RUNTIME_CALL = ("cuda", "cu")  # runtime/driver API events are not ops


def op_chains(ops: Sequence[tuple]) -> Dict[int, List[str]]:
    """Enclosing op names, innermost first, of every op: `ops` are (id, name, thread, start_ns,
    end_ns); an op's parent is the innermost op of the same thread whose interval holds it."""
    parent: Dict[int, Optional[int]] = {}
    names = {}
    by_thread: Dict[int, list] = {}
    for op in ops:
        by_thread.setdefault(op[2], []).append(op)
        names[op[0]] = op[1]
    for thread_ops in by_thread.values():
        stack: list = []
        for oid, _, _, start, end in sorted(thread_ops, key=lambda o: (o[3], -o[4])):
            # an open op that ends before this one does (finished, or overlapping without
            # nesting) is not its parent
            while stack and stack[-1][1] < end:
                stack.pop()
            parent[oid] = stack[-1][0] if stack else None
            stack.append((oid, end))
    chains: Dict[int, List[str]] = {}
    for oid in parent:
        chain, p, seen = [], oid, set()
        while p is not None and p not in seen:
            seen.add(p)
            chain.append(names[p])
            p = parent.get(p)
        chains[oid] = chain
    return chains


def records_from(prof, phase: str, step: int) -> List[dict]:
    """Every GPU activity (kernels, memsets, copies) of a finished torch.profiler run, in start
    order, with its enclosing CPU ops (kineto links a GPU activity to the innermost op that was
    open when it was launched)."""
    from torch.autograd import DeviceType

    events = prof.profiler.kineto_results.events()
    ops, shapes = [], {}
    for e in events:
        if e.device_type() == DeviceType.CPU and e.linked_correlation_id() == 0 and not e.name().startswith(_RUNTIME_CALL):
            ops.append((e.correlation_id(), e.name(), e.start_thread_id(), e.start_ns(), e.end_ns()))
            shapes[e.correlation_id()] = [list(s) for s in e.shapes()] if e.shapes() else None
    chains = op_chains(ops)
    out = []
    for e in events:
        if e.device_type() != DeviceType.CUDA:
            continue
        link = e.linked_correlation_id()
        out.append({"name": e.name(), "us": e.duration_ns() / 1000, "start_ns": e.start_ns(), "phase": phase,
                    "step": step, "ops": chains.get(link, []), "shapes": shapes.get(link)})
    out.sort(key=lambda r: r["start_ns"])
    return out


def profile_impl(impl, dy, steps: int, warmup: int = 2, forward_only: bool = False) -> List[dict]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from measure import step_fn

    step = (lambda: impl.forward()) if forward_only else step_fn(impl, dy)
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    records = []
    for s in range(steps):
        for t in impl.leaves:
            t.grad = None
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as pf:
            y = impl.forward()
            torch.cuda.synchronize()
        records += records_from(pf, "forward", s)
        if not forward_only:
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as pb:
                y.backward(dy)
                torch.cuda.synchronize()
            records += records_from(pb, "backward", s)
        del y
    return records


def _profile_one(impl_name: str, shape: dict, T: int, steps: int, peers_root, forward_only: bool = False) -> dict:
    """One impl's numbers; its inputs and weights are freed on return. forward_only: the
    forward's kernels and the forward's time in "step_ms" (no backward runs: a peer's backward
    kernels need not be compiled)."""
    import torch

    import impls as builders
    from measure import median_ms, step_fn

    inp = builders.make_inputs(shape, "random", T)
    impl = builders.build(impl_name, inp, peers_root)
    records = kf.assign(profile_impl(impl, inp.dy, steps, forward_only=forward_only), impl_name)
    if forward_only:
        with torch.no_grad():
            step_ms, _ = median_ms(lambda: impl.forward(), 10)
    else:
        step_ms, _ = median_ms(step_fn(impl, inp.dy), 10)
    kernels = kf.top_kernels(records, n=10 ** 6)
    return {"family_ms": kf.family_ms(records), "step_ms": step_ms, "kernels": kernels, "top": kernels[:25],
            "kernels_per_step": len(records) / steps,
            "unmapped": sorted({r["name"] for r in records if r["how"] == "none"})}


def compare(name: str, tokens: Optional[int] = None, steps: int = 3, peers_root=None,
            impls: Sequence[str] = IMPLS, forward_only: bool = False) -> dict:
    """The comparison on one shape: per impl the family ms, every kernel by (name, phase), the
    step by events; impls that cannot run are listed under "errors" with the reason."""
    import torch

    import impls as builders

    shape = SHAPES[name]
    T = tokens or shape["T"]
    result = {"shape": shape, "tokens": T, "steps": steps, "device": torch.cuda.get_device_name(), "impls": {},
              "errors": {}, "forward_only": forward_only}
    for impl_name in impls:
        try:
            result["impls"][impl_name] = _profile_one(impl_name, shape, T, steps, peers_root, forward_only)
        except builders.Unavailable as e:
            result["errors"][impl_name] = str(e)
        except Exception as e:  # noqa: BLE001 - one impl's failure must not lose the other's numbers
            result["errors"][impl_name] = f"{type(e).__name__}: {e}"
        torch.cuda.empty_cache()
        if impl_name in result["impls"]:
            print(f"kernels: {name} {impl_name}: {result['impls'][impl_name]['family_ms'].get('total', 0):.2f} ms of "
                  f"kernels a step, step {result['impls'][impl_name]['step_ms']:.2f} ms", flush=True)
    return result


def write(results: Sequence[dict], out: Path) -> None:
    """kernels.md (every shape's tables) and kernels.json under `out`."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "kernels.json").write_text(json.dumps(list(results), indent=2))
    (out / "kernels.md").write_text("\n".join(kf.render(r) for r in results))


def run(names: Sequence[str], out: Path, tokens: Optional[int] = None, steps: int = 3, peers_root=None,
        impls: Sequence[str] = IMPLS, forward_only: bool = False) -> List[dict]:
    results = [compare(n, tokens, steps, peers_root, impls, forward_only) for n in names]
    write(results, out)
    return results


def main():
    import plan
    import peers

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="qwen3-30b-a3b", help="suite shapes, comma-separated")
    ap.add_argument("--tokens", type=int, default=None, help="T (default: each shape's suite T)")
    ap.add_argument("--steps", type=int, default=3, help="profiled steps (the median is reported)")
    ap.add_argument("--peers", default=None, help=f"folder holding the peers' folders (default {peers.DEFAULT_ROOT}, "
                                                   "or MOEBLAZE_PEERS)")
    ap.add_argument("--impls", default=",".join(IMPLS), help="implementations, comma-separated (default: %(default)s)")
    ap.add_argument("--forward-only", action="store_true",
                    help="profile the forward alone (a peer's backward kernels need not compile); step_ms is the forward's")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    try:
        names = plan.parse_list(a.shapes, list(SHAPES), "--shapes")
    except ValueError as e:
        sys.exit(str(e))
    if a.steps < 1:
        sys.exit("--steps: at least 1")
    if a.tokens is not None and a.tokens < 1:
        sys.exit("--tokens: at least 1")
    try:
        impls = plan.parse_list(a.impls, list(IMPLS), "--impls")
    except ValueError as e:
        sys.exit(str(e))
    run(names, Path(a.out), a.tokens, a.steps, Path(a.peers) if a.peers else None, impls, a.forward_only)
    print((Path(a.out) / "kernels.md").read_text())


if __name__ == "__main__":
    main()
