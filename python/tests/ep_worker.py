"""One rank of the expert-parallel tests (test_ep_gloo.py, test_ep_gpu.py start it once per
rank): builds the same global batch and weights on every rank, runs the EP layer forward and
backward, and saves what it got for the test to compare.

    python ep_worker.py CONFIG_JSON RANK

Modes (a case's "mode"):
- "ep": EP over the world for each chunk count of config "chunks" ("world_c<chunks>"), then
  EP = 1 ("ep1_c<chunks>") on rank 0
  alone (a one-rank group) over the whole batch, the batches of the ranks concatenated in
  rank order, for each chunk count again; with config "plain" also moeblaze.torch.moe on
  the whole batch (rank 0).
- "fsdp": a (dp, ep) DeviceMesh, EPMoE with fully_shard_ep, one step; then EP = 1 on rank 0
  alone without FSDP over the whole batch.
- "faults": for each of the case's "faults" (one rank's input made bad: see fault_call), an
  EP call on every rank, recording what each raised; then a healthy call ("after"), which
  only works when every rank left the faulty call at the same collective.
"""
import datetime
import json
import os
import sys

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from moeblaze.ep import EPMoE, ep_moe, fully_shard_ep  # noqa: E402
from moeblaze.ep_experts import MoeblazeExperts, TorchExperts  # noqa: E402

DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}


def make_data(cfg):
    """The global batch, routing and full weights, the same on every rank (CPU, then moved).
    "integer": small integers, so that every sum in float32/float64 is exact and bitwise
    comparison checks the routing, not the summation order."""
    g = torch.Generator().manual_seed(cfg.get("seed", 0))
    E, K, d, n = cfg["E"], cfg["K"], cfg["d"], cfg["n"]
    T = sum(cfg["T"])
    pick = cfg.get("pick_experts", E)  # < E: skewed routing onto the first `pick` experts
    ids = torch.stack([torch.randperm(pick, generator=g)[:K] for _ in range(T)]).int() if T else \
        torch.zeros(0, K, dtype=torch.int32)
    if cfg.get("integer"):
        def ints(shape, lo, hi):
            return torch.randint(lo, hi, shape, generator=g).double()
        x, dy = ints((T, d), -2, 3), ints((T, d), -2, 3)
        gates = ints((T, K), 1, 4)
        w1, w3, w2 = ints((E, n, d), -1, 2), ints((E, n, d), -1, 2), ints((E, d, n), -1, 2)
    else:
        x, dy = torch.randn(T, d, generator=g), torch.randn(T, d, generator=g)
        gates = torch.rand(T, K, generator=g).softmax(-1)
        w1 = torch.randn(E, n, d, generator=g) * d ** -0.5
        w3 = torch.randn(E, n, d, generator=g) * d ** -0.5
        w2 = torch.randn(E, d, n, generator=g) * n ** -0.5
    return dict(x=x, dy=dy, ids=ids, gates=gates, w1=w1, w3=w3 if cfg.get("gated", True) else None, w2=w2)


def engine_of(cfg):
    if cfg["engine"] == "torch":
        return TorchExperts(cfg.get("activation", "relu"))
    return MoeblazeExperts(cfg.get("activation", "swiglu"), cfg.get("checkpoint", "save-h"), cfg.get("tiles", "tuned"))


def leaf(t, dtype, dev):
    return None if t is None else t.to(dev, dtype).requires_grad_()


def run_ep(cfg, data, dev, rows, experts, group, chunks):
    """EP forward + backward on tokens rows[0]:rows[1] with experts experts[0]:experts[1]."""
    dt, gdt = DTYPES[cfg["dtype"]], DTYPES[cfg.get("gate_dtype", cfg["dtype"])]
    r0, r1 = rows
    e0, e1 = experts
    x = leaf(data["x"][r0:r1], dt, dev)
    gates = leaf(data["gates"][r0:r1], gdt, dev)
    w = [leaf(data[k][e0:e1] if data[k] is not None else None, dt, dev) for k in ("w1", "w3", "w2")]
    out = ep_moe(x, w[0], w[1], w[2], data["ids"][r0:r1].to(dev), gates, num_experts=cfg["E"], group=group,
                 chunks=chunks, engine=engine_of(cfg), exchange=cfg.get("exchange", "all_to_all"),
                 max_tokens=cfg.get("max_tokens"))
    out.y.backward(data["dy"][r0:r1].to(dev, dt))
    res = dict(y=out.y, dx=x.grad, dgates=gates.grad, dw1=w[0].grad, dw2=w[2].grad, counts=out.expert_counts)
    if w[1] is not None:
        res["dw3"] = w[1].grad
    return {k: v.detach().cpu() for k, v in res.items()}


def run_plain(cfg, data, dev):
    """moeblaze.torch.moe (one GPU, no EP) on the whole batch."""
    import moeblaze.torch as mbt
    x = leaf(data["x"], torch.bfloat16, dev)
    gates = leaf(data["gates"], torch.float32, dev)
    w = [leaf(data[k], torch.bfloat16, dev) for k in ("w1", "w3", "w2")]
    out = mbt.moe(x, w[0], w[1], w[2], topk_ids=data["ids"].to(dev), topk_weights=gates,
                  activation=cfg.get("activation", "swiglu"))
    out.y.backward(data["dy"].to(dev, torch.bfloat16))
    res = dict(y=out.y, dx=x.grad, dgates=gates.grad, dw1=w[0].grad, dw2=w[2].grad)
    if w[1] is not None:
        res["dw3"] = w[1].grad
    return {k: v.detach().cpu() for k, v in res.items()}


def mode_ep(cfg, rank, world, dev):
    data = make_data(cfg)
    T = cfg["T"]
    start = sum(T[:rank])
    local = cfg["E"] // world
    results = {}
    for chunks in cfg["chunks"]:
        results[f"world_c{chunks}"] = run_ep(cfg, data, dev, (start, start + T[rank]),
                                                 (rank * local, (rank + 1) * local), None, chunks)
    if not cfg.get("solo", True):
        return results
    solo = dist.new_group([0])  # every rank takes part in creating it
    if rank == 0:
        for chunks in cfg["chunks"]:
            results[f"ep1_c{chunks}"] = run_ep(cfg, data, dev, (0, sum(T)), (0, cfg["E"]), solo, chunks)
        if cfg.get("plain"):
            results["plain"] = run_plain(cfg, data, dev)
    return results


def mode_fsdp(cfg, rank, world, dev):
    from torch.distributed.device_mesh import init_device_mesh
    dp, ep = cfg["dp"], cfg["ep"]
    mesh = init_device_mesh(dev.type, (dp, ep), mesh_dim_names=("dp", "ep"))
    data = make_data(cfg)
    T = cfg["T"]
    dt = DTYPES[cfg["dtype"]]
    E, K, d, n = cfg["E"], cfg["K"], cfg["d"], cfg["n"]

    def build(**kw):
        torch.manual_seed(0)
        m = EPMoE(E, K, d, n, activation=cfg.get("activation", "relu"), router="softmax", renormalize=True,
                  engine=engine_of(cfg), device=dev, dtype=dt, **kw)
        with torch.no_grad():
            m.gate.weight.copy_(data["w1"][:E, 0, :].to(dt) * 0.25)
        m.load_experts(*(data[k].to(dev, dt) if data[k] is not None else None for k in ("w1", "w3", "w2")))
        return m

    m = build(mesh=mesh, ep_dim="ep", chunks=cfg.get("fsdp_chunks", 1))
    fully_shard_ep(m, mesh)
    start = sum(T[:rank])
    x = data["x"][start:start + T[rank]].to(dev, dt).requires_grad_()
    out = m(x)
    out.y.backward(data["dy"][start:start + T[rank]].to(dev, dt))
    lo, hi = m.expert_range
    res = dict(y=out.y.detach().cpu(), dx=x.grad.cpu(), experts=torch.tensor([lo, hi]),
               gate=m.gate.weight.grad.full_tensor().cpu())
    for k in ("w1", "w3", "w2"):
        p = getattr(m.experts, k)
        if p is not None:
            res["d" + k] = p.grad.full_tensor().cpu()
    results = {"fsdp": res}
    solo = dist.new_group([0])
    if rank == 0:
        ref = build(ep_group=solo)
        xr = data["x"].to(dev, dt).requires_grad_()
        o = ref(xr)
        o.y.backward(data["dy"].to(dev, dt))
        r = dict(y=o.y.detach().cpu(), dx=xr.grad.cpu(), gate=ref.gate.weight.grad.cpu())
        for k in ("w1", "w3", "w2"):
            p = getattr(ref.experts, k)
            if p is not None:
                r["d" + k] = p.grad.cpu()
        results["ep1"] = r
    return results


def fault_call(cfg, data, dev, rank, world, fault):
    """One EP forward + backward where rank fault["rank"] gets a bad input: "bad_id" (its
    first token's pick 0 becomes fault["value"]: a number, "E" or "2E"), "num_experts" /
    "chunks" (its value is fault["value"]), "experts_local" (one expert fewer in its
    weights), "top_k" (its last pick dropped), "x_dtype" (x in float16), "weights_shape"
    (topk_weights one token short). Returns what it raised, as {"raised": type, "argument":
    ..., "message": ...}, or {"raised": None, "y": ..., "dx": ...}."""
    T, dt, gdt = cfg["T"], DTYPES[cfg["dtype"]], DTYPES[cfg.get("gate_dtype", cfg["dtype"])]
    start, local = sum(T[:rank]), cfg["E"] // world
    r0, r1, e0, e1 = start, start + T[rank], rank * local, (rank + 1) * local
    x = leaf(data["x"][r0:r1], dt, dev)
    ids = data["ids"][r0:r1].clone()
    gates = leaf(data["gates"][r0:r1], gdt, dev)
    w1, w3, w2 = (leaf(data[k][e0:e1], dt, dev) for k in ("w1", "w3", "w2"))
    kw = dict(num_experts=cfg["E"], chunks=1, engine=engine_of(cfg))
    kind = fault["kind"] if fault.get("rank") == rank else None
    value = {"E": cfg["E"], "2E": 2 * cfg["E"]}.get(fault.get("value"), fault.get("value"))
    if kind == "bad_id":
        ids[0, 0] = value
    elif kind in ("num_experts", "chunks"):
        kw[kind] = value
    elif kind == "experts_local":
        w1, w3, w2 = (w[:-1].detach().clone().requires_grad_() for w in (w1, w3, w2))
    elif kind == "top_k":
        ids, gates = ids[:, :-1].contiguous(), gates[:, :-1].detach().clone().requires_grad_()
    elif kind == "x_dtype":
        x = x.detach().to(torch.float16).requires_grad_()
    elif kind == "weights_shape":
        gates = gates[:-1].detach().clone().requires_grad_()
    try:
        out = ep_moe(x, w1, w3, w2, ids.to(dev), gates, **kw)
        out.y.backward(data["dy"][r0:r1].to(dev, dt))
    except Exception as e:  # noqa: BLE001 - what was raised is the result
        return dict(raised=type(e).__name__, argument=getattr(e, "argument", None), message=str(e))
    return dict(raised=None, y=out.y.detach().cpu(), dx=x.grad.cpu())


def mode_faults(cfg, rank, world, dev):
    data = make_data(cfg)
    results = {f["name"]: fault_call(cfg, data, dev, rank, world, f) for f in cfg["faults"]}
    results["after"] = fault_call(cfg, data, dev, rank, world, {})
    return results


MODES = {"ep": mode_ep, "fsdp": mode_fsdp, "faults": mode_faults}


def main():
    """argv[1]: {"world", "backend", "device", "init_file", "out_dir", "cases": [case, ...]}
    ("device": "cpu", "cuda:0" for every rank on one GPU, or "cuda:{rank}");
    every case runs in this one process group (process start-up is the slow part)."""
    cfg = json.loads(sys.argv[1])
    rank = int(sys.argv[2])
    world = cfg["world"]
    dev = torch.device(cfg.get("device", "cpu").format(rank=rank))  # "cuda:{rank}": one GPU per rank
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    # "pg_timeout_s": a collective that waits longer fails, so that a hang shows as an error
    timeout = datetime.timedelta(seconds=cfg.get("pg_timeout_s", 1800))
    dist.init_process_group(cfg.get("backend", "gloo"), init_method="file://" + cfg["init_file"], rank=rank,
                            world_size=world, timeout=timeout)
    try:
        results = []
        for case in cfg["cases"]:
            results.append(MODES[case["mode"]](case, rank, world, dev))
        torch.save(results, os.path.join(cfg["out_dir"], f"rank{rank}.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
