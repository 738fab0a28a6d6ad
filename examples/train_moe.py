#!/usr/bin/env python3
"""Train a small Qwen3-MoE-style model from config on the Python standard library's source
(byte-level tokens: text that ships with every machine) with each of transformers' experts
implementations compared: "grouped_mm" (transformers' default, torch._grouped_mm), "eager"
(its per-expert loop) and "moeblaze"; same seed, same data, same AdamW.

Prints tokens/s and peak memory of each, writes the loss curves (PNG, one fixed colour per
implementation) and a JSON with every step's loss, and exits 1 if any curve disagrees with the
first one's beyond noise (window means of 20 steps further apart than --tolerance, relative).
Without a GPU it runs the implementations that run on the CPU (eager and grouped_mm; moeblaze
needs sm_90) and reports no peak memory.

    python examples/train_moe.py                          # all three, 300 steps
    python examples/train_moe.py --experts moeblaze grouped_mm --steps 100
    python examples/train_moe.py --out bench/results/DATE/train_moe
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch
import transformers

WINDOW = 20  # steps per window mean when the curves are compared
IMPLEMENTATIONS = ["grouped_mm", "eager", "moeblaze"]
CPU_IMPLEMENTATIONS = ["grouped_mm", "eager"]
# One colour per implementation, the same in every run and plot.
COLOURS = {"grouped_mm": "#1f77b4", "eager": "#7f7f7f", "moeblaze": "#d62728"}


def stdlib_bytes(limit: int) -> torch.Tensor:
    """The .py files of the standard library (sorted, so every run reads the same text), up to
    `limit` bytes, as uint8 token ids."""
    root = Path(os.__file__).resolve().parent
    chunks, total = [], 0
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts or "test" in path.parts:
            continue
        try:
            data = path.read_bytes()
        except OSError:
            continue
        chunks.append(data)
        total += len(data)
        if total >= limit:
            break
    if total < 1 << 20:
        raise SystemExit(f"train_moe: found only {total} bytes of Python source under {root}")
    return torch.frombuffer(bytearray(b"".join(chunks)[:limit]), dtype=torch.uint8)


def model_config(args) -> transformers.Qwen3MoeConfig:
    return transformers.Qwen3MoeConfig(
        vocab_size=256, hidden_size=args.hidden, intermediate_size=4 * args.hidden, moe_intermediate_size=args.ffn,
        num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64, num_key_value_heads=args.hidden // 128,
        head_dim=64, num_experts=args.num_experts, num_experts_per_tok=args.top_k, norm_topk_prob=True,
        decoder_sparse_step=1, max_position_embeddings=args.seq, tie_word_embeddings=False,
        output_router_logits=True, router_aux_loss_coef=1e-3, bos_token_id=1, eos_token_id=2, pad_token_id=0)


def batches(data: torch.Tensor, args, device):
    """The same sequence of random windows for every run."""
    g = torch.Generator().manual_seed(args.seed + 1)
    n = data.numel() - args.seq - 1
    for _ in range(args.steps):
        starts = torch.randint(0, n, (args.batch,), generator=g)
        yield torch.stack([data[s:s + args.seq].long() for s in starts.tolist()]).to(device, non_blocking=True)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def train(impl: str, data: torch.Tensor, args, device: torch.device) -> dict:
    torch.manual_seed(args.seed)
    model = transformers.AutoModelForCausalLM.from_config(model_config(args), experts_implementation=impl,
                                                          dtype=torch.bfloat16).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 30))
    cuda = device.type == "cuda"
    _sync(device)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    losses, t0, timed_from = [], None, min(10, args.steps // 2)
    for step, ids in enumerate(batches(data, args, device)):
        if step == timed_from:  # kernels loaded and compiled, allocator warm
            _sync(device)
            t0 = time.perf_counter()
        out = model(input_ids=ids, labels=ids)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(out.loss.detach())
    _sync(device)
    seconds = time.perf_counter() - t0
    losses = [float(v) for v in torch.stack(losses).cpu()]
    tokens = (args.steps - timed_from) * args.batch * args.seq
    # Peak above what the weights held before the first step: gradients, optimizer state, activations.
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20 if cuda else None
    return {"experts": impl, "losses": losses, "tokens_per_s": tokens / seconds,
            "step_ms": 1e3 * seconds / (args.steps - timed_from), "peak_mib": peak,
            "params": sum(p.numel() for p in model.parameters())}


def window_means(losses):
    n = len(losses) // WINDOW
    return [sum(losses[i * WINDOW:(i + 1) * WINDOW]) / WINDOW for i in range(n)]


def compare(run, baseline):
    """Largest relative gap between two runs' window means after the first window (the
    warm-up's steep part)."""
    a, b = window_means(run["losses"]), window_means(baseline["losses"])
    gaps = [abs(x - y) / abs(y) for x, y in zip(a[1:], b[1:])]
    return max(gaps) if gaps else 0.0


def plot(runs, path: Path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("train_moe: matplotlib is not installed, no PNG written", file=sys.stderr)
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    for r in runs:
        peak = f", peak {r['peak_mib']:.0f} MiB" if r["peak_mib"] is not None else ""
        ax.plot(r["losses"], label=f"{r['experts']} ({r['tokens_per_s'] / 1e3:.1f}k tok/s{peak})", linewidth=1,
                color=COLOURS[r["experts"]])
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (bytes, + router aux loss)")
    ax.set_title("Qwen3-MoE-style model on the Python standard library")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")
    return fig


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--experts", nargs="+", choices=IMPLEMENTATIONS + ["all"], default=["all"],
                   help="implementations to run, the first is the baseline the others are compared with "
                        "(default: all that run on this machine)")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--ffn", type=int, default=256, help="expert width (moe_intermediate_size)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--num-experts", type=int, default=32)
    p.add_argument("--top-k", type=int, default=4)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-mb", type=float, default=32.0, help="bytes of standard-library source to read")
    p.add_argument("--tolerance", type=float, default=0.02, help="largest relative gap of window means")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    p.add_argument("--out", type=Path, default=Path("train_moe_out"))
    args = p.parse_args(argv)
    cuda = torch.cuda.is_available() if args.device == "auto" else args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise SystemExit("train_moe: --device cuda, but no CUDA GPU is visible")
    device = torch.device("cuda" if cuda else "cpu")
    impls = args.experts
    if impls == ["all"]:
        impls = IMPLEMENTATIONS if cuda else CPU_IMPLEMENTATIONS
    elif "all" in impls:
        raise SystemExit("train_moe: --experts all stands alone")
    if "moeblaze" in impls and not cuda:
        raise SystemExit("train_moe: moeblaze needs a CUDA GPU (sm_90); on the CPU run --experts grouped_mm eager")
    if len(set(impls)) != len(impls):
        raise SystemExit("train_moe: an implementation is named twice")
    if args.steps < 2 * WINDOW:
        raise SystemExit(f"train_moe: --steps must be at least {2 * WINDOW}")
    if args.hidden % 128:
        raise SystemExit("train_moe: --hidden must be a multiple of 128 (64-wide heads, 2 per KV head)")
    if "moeblaze" in impls:
        import moeblaze.hf  # noqa: F401  (registers experts_implementation="moeblaze")

    data = stdlib_bytes(int(args.data_mb * 2**20))
    print(f"data: {data.numel() / 2**20:.1f} MiB of Python standard-library source (byte tokens); device {device}")
    runs = []
    for impl in impls:
        r = train(impl, data, args, device)
        runs.append(r)
        peak = f"peak {r['peak_mib']:8.1f} MiB" if r["peak_mib"] is not None else "peak n/a (CPU)"
        print(f"{impl:>10}: {r['tokens_per_s']:10.0f} tokens/s  {r['step_ms']:8.2f} ms/step  {peak}"
              f"  loss {r['losses'][0]:.3f} -> {sum(r['losses'][-WINDOW:]) / WINDOW:.3f}")
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
              "model": model_config(args).to_dict() | {"params": runs[0]["params"]},
              "device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
              "transformers": transformers.__version__, "baseline": impls[0], "runs": runs, "comparisons": {}}
    ok = not any(math.isnan(v) for r in runs for v in r["losses"])
    base = runs[0]
    for r in runs[1:]:
        gap = compare(r, base)
        agree = gap <= args.tolerance
        ok = ok and agree
        speed = r["tokens_per_s"] / base["tokens_per_s"]
        memory = r["peak_mib"] / base["peak_mib"] if r["peak_mib"] and base["peak_mib"] else None
        result["comparisons"][r["experts"]] = {"max_window_gap": gap, "agree": agree, "tokens_per_s_ratio": speed,
                                               "peak_ratio": memory}
        mem = f", peak {memory:.2f}x" if memory is not None else ""
        print(f"{r['experts']} vs {base['experts']}: largest gap of {WINDOW}-step window means {gap:.4f} (tolerance "
              f"{args.tolerance}): {'agree' if agree else 'DISAGREE'}; tokens/s {speed:.2f}x{mem}")
    (args.out / "train_moe.json").write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out / 'train_moe.json'}")
    plot(runs, args.out / "train_moe_loss.png")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
