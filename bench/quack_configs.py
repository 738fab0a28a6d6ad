"""QuACK's autotuned GEMM configurations, as SonicMoE ran them: QuACK times each candidate tile
per GEMM shape and keeps every timing beside its compiled kernels (`<hash>/gemm*_tuned.autotune.json`
in the unpacked peer's `quack_cache/`, or in the `quack_cache_new.tgz` that bench/run_suite.sh
saves). This prints, per GEMM, its kind, operand and output shapes, the winning tile and the
runners-up with their times, and names the moeblaze family when the layer shape is given:

    python3 bench/quack_configs.py build-dev/quack_cache_new.tgz --shape mixtral-8x7b

Kinds: gemm_gated = gate_up (gathered x, SwiGLU epilogue), gemm_dgated = down_dgrad (gathered dy,
dSwiGLU epilogue); a plain gemm with a 2-D output is a per-slot GEMM (down_proj: A [slots, n];
gate_up_dgrad: A [slots, G n]), with a 3-D [E, M, N] output a weight gradient (down_wgrad: N = n;
gate_up_wgrad: N = G n). The times are QuACK's autotuner's (its own timing loop), a guide rather
than a profiler's figure.
"""
from __future__ import annotations

import argparse
import io
import json
import re
import sys
import tarfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def autotune_files(source: Path):
    """(name, text) of every autotune JSON under a folder or in a .tgz."""
    if not source.exists():
        raise SystemExit(f"quack_configs: {source}: no such file or folder (a quack_cache/ folder or quack_cache_new.tgz)")
    if source.is_dir():
        for p in sorted(source.rglob("*.autotune.json")):
            yield str(p.relative_to(source)), p.read_text()
    elif tarfile.is_tarfile(source):
        with tarfile.open(source) as tar:
            for m in tar.getmembers():
                if m.isfile() and m.name.endswith(".autotune.json"):
                    yield m.name, tar.extractfile(m).read().decode()
    else:
        raise SystemExit(f"quack_configs: {source}: neither a folder nor a tar archive of QuACK's cache")


def shapes(key: list) -> list[tuple[int, ...]]:
    return [tuple(int(v) for v in re.findall(r"\d+", k)) for k in key if k.startswith("torch.Size")]


def config(text: str) -> str:
    c = dict(re.findall(r"(\w+)=(\w+)", text))
    sched = "ping-pong" if c.get("pingpong") == "True" else "cooperative"
    cm, cn = int(c.get("cluster_m", 1)), int(c.get("cluster_n", 1))
    pair = "" if cm * cn == 1 else (" pair along M" if cm == 2 else " pair along N")
    return f"{c.get('tile_m')}x{c.get('tile_n')} {sched}{pair}"


def family(kind: str, sh: list[tuple[int, ...]], n: int | None) -> str:
    if kind == "gemm_gated":
        return "gate_up"
    if kind == "gemm_dgated":
        return "down_dgrad"
    if len(sh) < 3 or n is None:
        return "?"
    out = sh[2]
    if len(out) == 3:  # [E, M, N]: a weight gradient
        return "down_wgrad" if out[2] == n else "gate_up_wgrad"
    return "down_proj" if sh[0][-1] == n else "gate_up_dgrad"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("source", type=Path, help="quack_cache/ folder or quack_cache_new.tgz")
    ap.add_argument("--shape", help="a suite shape (bench/plan.py): name each GEMM's moeblaze family where its n matches")
    ap.add_argument("--top", type=int, default=3, help="configurations shown per GEMM (default 3)")
    a = ap.parse_args(argv)
    n = None
    if a.shape:
        from plan import SHAPES  # noqa: E402
        if a.shape not in SHAPES:
            ap.error(f"--shape: unknown '{a.shape}' (suite shapes: {', '.join(SHAPES)})")
        n = SHAPES[a.shape]["n"]
    rows = 0
    for name, text in autotune_files(a.source):
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            print(f"quack_configs: {name}: not an autotune file ({e}); skipped", file=sys.stderr)
            continue
        kind = Path(name).name.replace("_tuned.autotune.json", "")
        sh = shapes(d.get("key", []))
        if n is not None and not any(n in s or 2 * n in s for s in sh):  # n, or G n of the gated GEMMs
            continue
        ranked = sorted(d.get("configs_timings", []), key=lambda c: min(c[1]))
        if not ranked:
            continue
        rows += 1
        print(f"{family(kind, sh, n):14s} {kind:12s} " + " x ".join(str(list(s)) for s in sh[:3]))
        for c, times in ranked[: a.top]:
            print(f"    {config(c):36s} {min(times):8.3f} ms")
    if rows == 0:
        print("quack_configs: no autotune results" + (f" with n = {n}" if n else ""), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
