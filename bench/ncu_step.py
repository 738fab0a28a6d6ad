"""One training step of an implementation for Nsight Compute: warm-up steps first (module loads;
SonicMoE autotunes and compiles its QuACK kernels there), then one forward + backward between
cudaProfilerStart and cudaProfilerStop, so that `ncu --profile-from-start off` profiles exactly
that step's kernels. The same inputs as the suite's (bench/impls.py), so moeblaze's kernels and a
peer's are profiled on the same shape and routing, one run each:

    ncu --profile-from-start off --target-processes all -k regex:Gemm --section SpeedOfLight \\
        python3 bench/ncu_step.py --impl sonicmoe --shape qwen3-30b-a3b

`tools/gpu_run.sh peerprofile` runs it for SonicMoE and moeblaze with the `profile` step's
sections. --check validates the arguments without a GPU (what the runner's --dry-run calls).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python"))
sys.path.insert(0, str(HERE))
from plan import IMPLS, SHAPES  # noqa: E402

ROUTINGS = ("random", "skewed")


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--impl", required=True, help=f"one of {', '.join(IMPLS)}")
    ap.add_argument("--shape", required=True, help=f"a suite shape: {', '.join(SHAPES)}")
    ap.add_argument("--tokens", type=int, default=None, help="T (default: the shape's)")
    ap.add_argument("--routing", default="random", help=f"{' or '.join(ROUTINGS)} (default random)")
    ap.add_argument("--warmup", type=int, default=3, help="unprofiled steps first (default 3)")
    ap.add_argument("--peers", default=None, help="folder holding the peers' folders (default: bench/peers.py's)")
    ap.add_argument("--check", action="store_true", help="validate the arguments and exit (no GPU)")
    a = ap.parse_args(argv)
    if a.impl not in IMPLS:
        ap.error(f"--impl: unknown '{a.impl}' (known: {', '.join(IMPLS)})")
    if a.shape not in SHAPES:
        ap.error(f"--shape: unknown '{a.shape}' (suite shapes: {', '.join(SHAPES)})")
    if a.routing not in ROUTINGS:
        ap.error(f"--routing: '{a.routing}' is not {' or '.join(ROUTINGS)}")
    if a.tokens is not None and a.tokens < 1:
        ap.error(f"--tokens: {a.tokens} is not a positive token count")
    if a.warmup < 1:
        ap.error(f"--warmup: {a.warmup}; at least one step must run before the profiled one (module loads, autotuning)")
    return a


def main(argv=None) -> int:
    a = parse(argv)
    T = a.tokens or SHAPES[a.shape]["T"]
    if a.check:
        print(f"ncu_step: {a.impl} on {a.shape} (T = {T}, {a.routing} routing): arguments valid")
        return 0
    import torch

    import impls
    from measure import step_fn

    inp = impls.make_inputs(SHAPES[a.shape], a.routing, T)
    try:
        impl = impls.build(a.impl, inp, Path(a.peers) if a.peers else None)
    except impls.Unavailable as e:
        print(f"ncu_step: {a.impl} cannot run here: {e}", file=sys.stderr)
        return 2
    step = step_fn(impl, inp.dy)
    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    step()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print(f"ncu_step: {a.impl} on {a.shape} (T = {T}, {a.routing} routing): one step profiled after {a.warmup} warm-up steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
