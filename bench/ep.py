"""Expert parallelism: per-GPU step time and tokens/s of the EP layer (moeblaze.ep) against the
single-GPU layer doing the same per-GPU work, the bytes exchanged, and the time the chunked
overlap hides.

    torchrun --nproc-per-node 2 bench/ep.py --preset deepseek-v3       # EP = 2 (nvidia-h200-x2)
    python bench/ep.py --preset deepseek-v3 --experts 128               # EP = 1 on one GPU

Every rank gets T tokens (--tokens, default the suite's T: 16384 for deepseek-v3), routed
uniformly at random (--routing) over all E experts; each rank holds E / ep experts. Measured
per rank, CUDA events, median of --steps steps after warm-up, ranks aligned by a barrier:
- single:     moeblaze.torch.moe on this GPU alone with E / ep experts and the same T tokens
              (the same per-GPU work, no exchange): the target's baseline;
- ep c=1:     the EP step (forward + backward), one chunk: every exchange exposed;
- ep c=C:     the EP step with C chunks (--chunks): exchanges overlapped with compute;
- compute:    the local expert compute alone (moeblaze, K = 1) on the rows an EP step
              receives, C chunks back to back: the floor of the EP step;
- exchange:   the step's six all_to_alls alone, one after another (x, gates, rows back;
              dy, dx and gate gradients back): what there is to hide.
Derived: exposed = ep - compute (exchange plus the EP bookkeeping: sort, gathers, combine);
hidden by overlap = ep c=1 - ep c=C; ratio = ep c=C / single (the target: <= 1.2 at EP = 2
on deepseek-v3, T = 16384). Bytes: what this rank sends to other ranks per step (its own rows
stay on the GPU).

NVLink multicast stays off: NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and
NVSHMEM_DISABLE_NVLS=1 are set here before torch.distributed starts (and nothing here calls
cuMulticastCreate).
"""
from __future__ import annotations

import os

for _k, _v in {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}.items():
    os.environ[_k] = _v

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python"))

SHAPES = {s["name"]: s for s in json.loads((HERE / "suite.json").read_text())["shapes"]}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="deepseek-v3", choices=sorted(SHAPES))
    p.add_argument("--tokens", type=int, help="tokens per GPU (default: the suite's T)")
    p.add_argument("--experts", type=int, help="override E (e.g. E/2 to run EP=2's per-GPU experts on one GPU)")
    p.add_argument("--chunks", type=int, default=4, help="chunks of the overlapped step (E/ep %% chunks == 0)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--routing", choices=("random", "balanced"), default="random")
    p.add_argument("--checkpoint", choices=("save-h", "recompute"), default="save-h")
    p.add_argument("--shape", help="E,K,d,n instead of the preset's (e.g. a small shape)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cpu: gloo, the plain-PyTorch expert compute and moeblaze.reference as 'single' "
                        "(a smoke run of the bench itself; its times mean nothing)")
    p.add_argument("--json", type=Path, help="write the results here (rank 0)")
    return p.parse_args(argv)


def init_dist(device: str):
    """(rank, world, torch.device): torchrun's group, else a one-rank group of its own."""
    import torch
    import torch.distributed as dist
    local = int(os.environ.get("LOCAL_RANK", 0))
    if device == "cpu":
        dev, kw = torch.device("cpu"), {}
    else:
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
        kw = {"device_id": dev}
    backend = "nccl" if device == "cuda" else "gloo"
    if "RANK" in os.environ:  # torchrun
        dist.init_process_group(backend, **kw)
    else:
        init = Path(tempfile.mkdtemp()) / "pg"
        dist.init_process_group(backend, init_method=f"file://{init}", rank=0, world_size=1, **kw)
    return dist.get_rank(), dist.get_world_size(), dev


def routing(T, K, E, kind, device, seed):
    import torch
    g = torch.Generator(device=device).manual_seed(seed)
    if kind == "balanced":  # every expert gets T K / E slots of this rank
        base = (torch.arange(T, device=device) * K)[:, None] + torch.arange(K, device=device)[None, :]
        ids = (base + seed) % E
    else:
        ids = torch.rand(T, E, generator=g, device=device).topk(K, dim=1).indices
    gates = torch.rand(T, K, generator=g, device=device).softmax(-1)
    return ids.int(), gates


def median_ms(fn, steps, warmup, barrier, cuda=True):
    """Median ms of fn over `steps` calls, CUDA events around each (wall clock on the CPU)."""
    import time
    import torch
    for _ in range(warmup):
        fn()
    if cuda:
        torch.cuda.synchronize()
    barrier()
    times = []
    for _ in range(steps):
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        barrier()  # ranks start each step together: a step's time is its slowest rank's exchange too
    times.sort()
    return times[len(times) // 2]


def main(argv=None):
    args = parse_args(argv)
    import torch
    import torch.distributed as dist
    from moeblaze._dispatch import host_splits, plan_dispatch, received_expert_ids, sent_bytes, received_bytes
    from moeblaze._exchange import Exchange
    from moeblaze.ep import ep_moe
    from moeblaze.ep_experts import MoeblazeExperts, TorchExperts

    rank, world, dev = init_dist(args.device)
    cuda = dev.type == "cuda"
    shape = dict(SHAPES[args.preset])
    if args.shape:
        shape.update(zip("EKdn", map(int, args.shape.split(","))))
    E = args.experts or shape["E"]
    K, d, n = shape["K"], shape["d"], shape["n"]
    T = args.tokens or shape["T"]
    if E % world:
        raise SystemExit(f"--experts: {E} experts do not shard over {world} ranks")
    local = E // world
    chunk_counts = sorted({1, args.chunks})
    for c in chunk_counts:
        if local % c:
            raise SystemExit(f"--chunks: {local} local experts do not split into {c} chunks")
    torch.manual_seed(1234)  # the same weights on every rank's slice is not needed, only shapes
    w1 = (torch.randn(local, n, d, device=dev) * d ** -0.5).bfloat16().requires_grad_()
    w3 = (torch.randn(local, n, d, device=dev) * d ** -0.5).bfloat16().requires_grad_()
    w2 = (torch.randn(local, d, n, device=dev) * n ** -0.5).bfloat16().requires_grad_()
    x = torch.randn(T, d, device=dev).bfloat16().requires_grad_()
    dy = torch.randn(T, d, device=dev).bfloat16()
    ids, gates = routing(T, K, E, args.routing, dev, seed=rank + 1)
    gates.requires_grad_()
    local_ids, _ = routing(T, K, local, args.routing, dev, seed=rank + 101)
    leaves = (x, gates, w1, w3, w2)
    barrier = dist.barrier

    def zero():
        for t in leaves:
            t.grad = None

    if cuda:
        import moeblaze.torch as mbt

        def single_step():
            zero()
            mbt.moe(x, w1, w3, w2, topk_ids=local_ids, topk_weights=gates, checkpoint=args.checkpoint).y.backward(dy)
        engine = MoeblazeExperts("swiglu", args.checkpoint)
    else:
        from moeblaze.reference import moe as ref_moe

        def single_step():
            zero()
            ref_moe(x, local_ids, gates, w1, w3, w2, "swiglu").backward(dy.float())
        engine = TorchExperts("swiglu")

    def ep_step(chunks):
        def step():
            zero()
            ep_moe(x, w1, w3, w2, ids, gates, num_experts=E, chunks=chunks, engine=engine).y.backward(dy)
        return step

    results = {"preset": args.preset, "E": E, "K": K, "d": d, "n": n, "T_per_gpu": T, "ep": world,
               "routing": args.routing, "checkpoint": args.checkpoint, "chunks": args.chunks,
               "device": torch.cuda.get_device_name(dev) if cuda else "cpu"}
    results["single_ms"] = median_ms(single_step, args.steps, args.warmup, barrier, cuda)
    for c in chunk_counts:
        results[f"ep_c{c}_ms"] = median_ms(ep_step(c), args.steps, args.warmup, barrier, cuda)

    # what one EP step receives and sends (the same routing every step)
    ex = Exchange()
    plan = plan_dispatch(ids, E, world, 1)
    recv_counts = ex.counts(plan.send_counts)
    splits = host_splits(plan.send_counts, recv_counts, 1, plan.slots)
    row = d * 2
    results["bytes_sent"] = (sent_bytes(splits, rank, 2 * row + 4) +        # x, dy rows out; gates out
                             received_bytes(splits, rank, 2 * row + 4))    # rows g*o, dx rows, d gates back
    results["rows_received"] = sum(splits.recv[0])

    for c in chunk_counts:
        parts = []
        for chunk in range(c):
            rows_c = int(recv_counts[:, chunk * (local // c):(chunk + 1) * (local // c)].sum())
            if rows_c == 0:
                continue
            lo, hi = chunk * (local // c), (chunk + 1) * (local // c)
            parts.append((torch.randn(rows_c, d, device=dev).bfloat16(),
                          received_expert_ids(recv_counts, chunk, c, rows_c),
                          torch.rand(rows_c, device=dev), torch.randn(rows_c, d, device=dev).bfloat16(), lo, hi))

        def compute():
            for rows_c, ids_c, g_c, dy_c, lo, hi in parts:
                out, st = engine.forward(rows_c, ids_c, g_c, w1[lo:hi], w3[lo:hi], w2[lo:hi])
                engine.backward(st, dy_c)
        results[f"compute_c{c}_ms"] = median_ms(compute, args.steps, args.warmup, barrier, cuda)

    send_x = torch.randn(plan.slots, d, device=dev).bfloat16()
    send_g = torch.rand(plan.slots, device=dev)
    recv_x = torch.randn(results["rows_received"], d, device=dev).bfloat16()
    recv_g = torch.rand(results["rows_received"], device=dev)
    s, r = splits.send[0], splits.recv[0]

    def exchange():
        for inp, o_splits, i_splits in ((send_x, r, s), (send_g, r, s), (recv_x, s, r),      # forward
                                        (send_x, r, s), (recv_x, s, r), (recv_g, s, r)):     # backward
            ex.rows(inp, o_splits, i_splits).wait()
    results["exchange_ms"] = median_ms(exchange, args.steps, args.warmup, barrier, cuda)

    # per-rank numbers -> the slowest rank (a step ends when every rank is done)
    keys = [k for k in results if k.endswith("_ms")]
    t = torch.tensor([results[k] for k in keys], device=dev, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    for k, v in zip(keys, t.tolist()):
        results[k] = v
    best = results[f"ep_c{max(chunk_counts)}_ms"]
    compute_best = results[f"compute_c{max(chunk_counts)}_ms"]
    results.update({
        "tokens_per_s_per_gpu_single": T / results["single_ms"] * 1e3,
        "tokens_per_s_per_gpu_ep": T / best * 1e3,
        "exposed_c1_ms": results["ep_c1_ms"] - results["compute_c1_ms"],
        "exposed_ms": best - compute_best,
        "hidden_by_overlap_ms": results["ep_c1_ms"] - best,
        "ratio_to_single": best / results["single_ms"],
        "exchange_gbps": results["bytes_sent"] / results["exchange_ms"] / 1e6,
    })
    if rank == 0:
        print(table(results, chunk_counts))
        if args.json:
            args.json.write_text(json.dumps(results, indent=1))
    dist.destroy_process_group()
    return results


def table(r, chunk_counts):
    lines = [f"EP={r['ep']} {r['preset']} E={r['E']} K={r['K']} d={r['d']} n={r['n']} T/GPU={r['T_per_gpu']} "
             f"({r['routing']}, {r['checkpoint']}; {r['device']}); times: slowest rank, median ms",
             "| what | ms |", "|---|---:|",
             f"| single GPU, E/ep experts (target base) | {r['single_ms']:.2f} |"]
    for c in chunk_counts:
        lines.append(f"| EP step, {c} chunk(s) | {r[f'ep_c{c}_ms']:.2f} |")
        lines.append(f"| expert compute alone, {c} chunk(s) | {r[f'compute_c{c}_ms']:.2f} |")
    lines += [f"| exchanges alone, in sequence | {r['exchange_ms']:.2f} |",
              f"| exposed (EP - compute), 1 chunk / best | {r['exposed_c1_ms']:.2f} / {r['exposed_ms']:.2f} |",
              f"| hidden by overlap | {r['hidden_by_overlap_ms']:.2f} |",
              f"| ratio EP / single (target <= 1.2 at EP=2) | {r['ratio_to_single']:.3f} |",
              f"| tokens/s per GPU: single / EP | {r['tokens_per_s_per_gpu_single']:.0f} / "
              f"{r['tokens_per_s_per_gpu_ep']:.0f} |",
              f"| bytes sent to other ranks per step (GB) | {r['bytes_sent'] / 1e9:.3f} |",
              f"| exchange GB/s (sent bytes / exchange time) | {r['exchange_gbps']:.0f} |"]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
