"""The moeblaze suite benchmark (docs/performance.md "Method"), on a GPU, in one invocation:
moeblaze (through the Python binding) against the PyTorch baselines of baselines.py, same
inputs, same GPU. Forward and step (forward+backward) median ms over CUDA events,
TFLOP/s = 18TKdn/step, activation memory held between forward and backward beyond the
output, and peak extra memory of a step (weights and their gradients excluded: peak_memory.py); random and
skewed routing; a token sweep; the dense GEMM and copy ceilings measured in the same run;
the per-kernel breakdown from `moeblaze bench --json`. Writes results.json, table.md and
tflops.png under --out.

Usage: python3 bench/suite.py [--shapes NAME,...] [--routing random,skewed] [--sweep]
       [--impls moeblaze,moeblaze-recompute,torch-grouped_mm,torch-loop] [--steps 10]
       [--out bench/results/DATE]
moeblaze runs in save-h mode, moeblaze-recompute in recompute mode (the table gives its step
against save-h as well as against the baselines)."""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python"))
sys.path.insert(0, str(HERE))
import moeblaze.torch as mbt  # noqa: E402
from baselines import torch_grouped_mm, torch_loop  # noqa: E402
from peak_memory import step_peak_bytes  # noqa: E402
from report import write_outputs  # noqa: E402
from moeblaze.reference import route  # noqa: E402

SUITE = json.loads((HERE / "suite.json").read_text())["shapes"]
ROUTERS = {  # the presets' routers (generator/layer_config.cpp)
    "mixtral-8x7b": ("softmax", True, 1.0), "gpt-oss-20b": ("softmax", True, 1.0),
    "olmoe-1b-7b": ("softmax", False, 1.0), "qwen3-30b-a3b": ("softmax", True, 1.0),
    "deepseek-v3": ("sigmoid", True, 2.5), "qwen3-next-80b": ("softmax", True, 1.0),
}


def median_ms(fn, steps, warmup=3):
    """Median and half the 10-90% spread of per-call times. Events are recorded around each
    call without a host sync in between, so the host runs ahead of the GPU as in training and
    launch overhead is only counted where the GPU would wait for it."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(steps)]
    for a, b in events:
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    times = sorted(a.elapsed_time(b) for a, b in events)
    return times[len(times) // 2], (times[int(0.9 * (len(times) - 1))] - times[int(0.1 * (len(times) - 1))]) / 2


def ceilings():
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms, _ = median_ms(lambda: a @ a, 10)
    src = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    cms, _ = median_ms(lambda: dst.copy_(src), 10)
    return {"gemm_tflops": 2 * 8192 ** 3 / ms / 1e9, "copy_tbps": 2 * src.numel() / cms / 1e9}


def skewed_routing(T, E, K, gen):
    hot = max(1, E // 16)
    p = torch.ones(E, device="cuda")
    p[:hot] = 4.0
    ids = torch.multinomial(p.expand(T, E), K, replacement=False, generator=gen).int()
    w = torch.rand(T, K, device="cuda", generator=gen).softmax(-1)
    return ids, w


def run_case(shape, impl, routing, T, steps):
    E, K, d, n = shape["E"], shape["K"], shape["d"], shape["n"]
    router, renorm, scale = ROUTERS[shape["name"]]
    gen = torch.Generator(device="cuda").manual_seed(0)
    kw = dict(device="cuda", dtype=torch.bfloat16)
    w1 = (torch.rand(E, n, d, generator=gen, device="cuda") * 2 - 1).mul_((3 / d) ** 0.5).to(torch.bfloat16).requires_grad_()
    w3 = (torch.rand(E, n, d, generator=gen, device="cuda") * 2 - 1).mul_((3 / d) ** 0.5).to(torch.bfloat16).requires_grad_()
    w2 = (torch.rand(E, d, n, generator=gen, device="cuda") * 2 - 1).mul_((3 / n) ** 0.5).to(torch.bfloat16).requires_grad_()
    wr = (torch.rand(E, d, generator=gen, device="cuda") * 2 - 1).mul_((3 / d) ** 0.5).to(torch.bfloat16).requires_grad_()
    x = torch.randn(T, d, generator=gen, **kw).requires_grad_()
    dy = torch.randn(T, d, generator=gen, **kw)
    fixed = skewed_routing(T, E, K, gen) if routing == "skewed" else None
    bias = torch.zeros(E, device="cuda") if router == "sigmoid" else None

    def forward():
        if impl.startswith("moeblaze"):
            mode = "recompute" if impl == "moeblaze-recompute" else "save-h"
            if fixed is None:
                return mbt.moe(x, w1, w3, w2, w_router=wr, router=router, top_k=K, router_bias=bias,
                               renormalize=renorm, route_scale=scale, checkpoint=mode).y
            return mbt.moe(x, w1, w3, w2, topk_ids=fixed[0], topk_weights=fixed[1].requires_grad_(),
                           checkpoint=mode).y
        ids, w = fixed if fixed is not None else route(x, wr, K, router, renorm, scale, bias)
        f = torch_loop if impl == "torch-loop" else torch_grouped_mm
        return f(x, ids, w, w1, w3, w2)

    params = [w1, w3, w2, wr]
    leaves = params + [x] + ([fixed[1]] if fixed is not None else [])

    def step():
        # As a training step with zero_grad(set_to_none=True): the weight gradients are
        # fresh tensors, not accumulated into old ones (an extra read-add-write of every
        # weight that is the optimizer's business, not the layer's).
        for t in leaves:
            t.grad = None
        forward().backward(dy)

    step()
    fwd_ms, _ = median_ms(lambda: forward(), steps)
    step_ms, spread = median_ms(step, steps)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    y = forward()
    act = torch.cuda.memory_allocated() - base - y.numel() * y.element_size()
    del y
    for t in leaves:  # the base holds no gradients: the step makes its own
        t.grad = None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    weight_grads = sum(p.numel() * p.element_size() for p in params)
    peak_alloc = torch.cuda.max_memory_allocated() - base - weight_grads  # all grads taken off the peak
    for t in leaves:
        t.grad = None
    peak = step_peak_bytes(step, lambda: [p.grad for p in params])  # grads excluded at every moment
    flops = 18.0 * T * K * d * n
    return {"shape": shape["name"], "impl": impl, "routing": routing, "tokens": T, "fwd_ms": fwd_ms,
            "step_ms": step_ms, "step_spread_ms": spread, "tflops": flops / step_ms / 1e9,
            "act_mib": act / 2 ** 20, "peak_mib": peak / 2 ** 20,
            "peak_alloc_mib": peak_alloc / 2 ** 20}


def moeblaze_cli():
    """The CLI of the build whose library the binding loads (MOEBLAZE_LIBRARY=<build>/lib/...),
    so the per-kernel breakdown times the same kernels as the table; else build/bin."""
    lib = os.environ.get("MOEBLAZE_LIBRARY")
    if lib:
        cli = Path(lib).resolve().parent.parent / "bin" / "moeblaze"
        if cli.exists():
            return cli
    return HERE.parent / "build" / "bin" / "moeblaze"


def kernel_breakdown(name, T):
    cli = moeblaze_cli()
    try:
        out = subprocess.run([str(cli), "bench", "--preset", name, "-T", str(T), "--json"], capture_output=True,
                             text=True, timeout=300, check=True)
        return json.loads(out.stdout)
    except Exception as e:  # noqa: BLE001 - a missing CLI must not lose the suite numbers
        return {"error": str(e)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=",".join(s["name"] for s in SUITE))
    ap.add_argument("--impls", default="moeblaze,moeblaze-recompute,torch-grouped_mm,torch-loop")
    ap.add_argument("--routing", default="random,skewed")
    ap.add_argument("--sweep", action="store_true", help="token sweep T = 4096..65536 on --sweep-shapes (when in --shapes)")
    ap.add_argument("--sweep-shapes", default="qwen3-30b-a3b,deepseek-v3")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--out", default=str(HERE / "results" / datetime.date.today().isoformat()))
    a = ap.parse_args()
    if a.steps < 10:
        sys.exit("--steps: the median needs at least 10")
    names = a.shapes.split(",")
    unknown = [n for n in names if n not in {s["name"] for s in SUITE}]
    if unknown:
        sys.exit(f"--shapes: unknown {unknown}")
    unknown = [n for n in a.sweep_shapes.split(",") if n not in {s["name"] for s in SUITE}]
    if unknown:
        sys.exit(f"--sweep-shapes: unknown {unknown}")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    res = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "device": torch.cuda.get_device_name(),
           "torch": torch.__version__, "ceilings": ceilings(), "results": [], "kernels": {}}
    print(f"{res['device']} torch {res['torch']}: GEMM {res['ceilings']['gemm_tflops']:.0f} TFLOP/s, "
          f"copy {res['ceilings']['copy_tbps']:.2f} TB/s", flush=True)
    cases = [(s, r, s["T"]) for s in SUITE if s["name"] in names for r in a.routing.split(",")]
    if a.sweep:
        cases += [(s, "random", T) for s in SUITE if s["name"] in names and s["name"] in a.sweep_shapes.split(",")
                  for T in (4096, 8192, 16384, 32768, 65536) if T != s["T"]]
    for shape, routing, T in cases:
        for impl in a.impls.split(","):
            if impl == "torch-loop" and shape["E"] >= 256:
                continue  # minutes per step at E >= 256: left out
            try:
                r = run_case(shape, impl, routing, T, a.steps)
            except torch.cuda.OutOfMemoryError as e:
                r = {"shape": shape["name"], "impl": impl, "routing": routing, "tokens": T, "error": f"OOM: {e}"}
            res["results"].append(r)
            print(json.dumps(r), flush=True)
            torch.cuda.empty_cache()
        if routing == "random" and T == shape["T"]:
            res["kernels"][shape["name"]] = kernel_breakdown(shape["name"], T)
        (out / "results.json").write_text(json.dumps(res, indent=2))  # partial results survive a kill
    write_outputs(res, out)


if __name__ == "__main__":
    main()
