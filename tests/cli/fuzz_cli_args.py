#!/usr/bin/env python3
"""A seeded fuzz of the moeblaze CLI's argument space, without a GPU.

Usage: fuzz_cli_args.py MOEBLAZE WORK_DIR CACHE_DB

Each run draws a subcommand and options with values from the edges (0, -1, 2^31, 2^63, 1e13,
huge products, NaN, infinities, text, empty strings) and paths that are not caches (a FIFO,
a folder, /dev/null, random bytes, a missing file). Every run must finish within its time
limit, without a signal, with a documented exit code (0, 1, 2, 3) and an "error:" line when it
fails; a number option given something that is not a finite number must exit 2; commands
that only read a cache must leave its file byte for byte as it was. Commands that would run
long (compiling, timing on a GPU) are always given one bad number, so they stop at
validation. The seed is printed; MOEBLAZE_FUZZ_SEED=N repeats a run, MOEBLAZE_FUZZ_RUNS=N
changes its length.
"""
import hashlib
import os
import random
import shutil
import subprocess
import sys

BIN, WORK, CACHE = sys.argv[1], sys.argv[2], sys.argv[3]
seed = int(os.environ.get("MOEBLAZE_FUZZ_SEED") or random.SystemRandom().randrange(2**32))
runs = int(os.environ.get("MOEBLAZE_FUZZ_RUNS") or 400)
print(f"fuzz: seed {seed} (MOEBLAZE_FUZZ_SEED={seed} repeats it)", flush=True)
rng = random.Random(seed)

NOT_NUMBERS = ["nan", "NaN", "inf", "-inf", "1e999", "abc", "", "0x", "1e", "+", "1,5", "\u0661\u0662", "12abc"]
EDGES = ["0", "1", "-1", "2", "7", "8", "10", "16", "17", "64", "100", "512", "513", "65536", "65544", "134217727",
         "134217728", "2147483647", "2147483648", "-2147483649", "4294967304", "9223372036854775807",
         "9223372036854775808", "1152921504606846976", "1e13", "1e30", "0.5", "-0", "1e3", "2.5", "1e-300"]
FAMILIES = ["gate_up", "down_proj", "down_dgrad", "down_wgrad", "gate_up_wgrad", "gate_up_dgrad", "router_topk", "nope", ""]
TILES = ["128x128x64_w8x1_s3_wgmma", "128x256x64_w8x1_s4_persist_tmacontig", "128x256x64_w8x1_s4_wsp_tma",
         "64x64x64_w2147483648x1_s3", "64x64x64_w99999x1_s3", "big", "", "128x128x64_w2x4_s3", "0x0x0_w0x0_s0",
         "128x128x64_w8x1_s3_wgmma_altorder_tmacontig", "128x128x64_w8x1_s3_wg_swap_tma", "-1x128x64_w8x1_s3",
         "128x128x64_w8x1_s99999", "128x256x64_w8x1_s4_persist_tmacontig_cluster99999x1"]
TEXT = ["swiglu", "geglu", "gelu", "relu", "silu", "swish", "none", "softmax", "sigmoid", "save-h", "recompute",
        "random", "skewed", "balanced", "one-hot", "router", "", "\x1b[2J", "x" * 300]

os.makedirs(WORK, exist_ok=True)
fifo = os.path.join(WORK, "fifo.db")
if not os.path.exists(fifo):
    os.mkfifo(fifo)
noise = os.path.join(WORK, "noise.db")
with open(noise, "wb") as f:
    f.write(bytes(rng.randrange(256) for _ in range(8192)))
folder = os.path.join(WORK, "folder")
os.makedirs(folder, exist_ok=True)


def number(bad_ok=True):
    """(value, is_bad): a number from the edges, or (sometimes) something that is not one."""
    if bad_ok and rng.random() < 0.2:
        return rng.choice(NOT_NUMBERS), True
    return rng.choice(EDGES), False


def shape_options(args, with_tokens):
    bad = False
    if rng.random() < 0.2:
        args += ["--preset", rng.choice(["qwen3-30b-a3b", "olmoe-1b-7b", "nope", ""])]
    for opt in ["-E", "-K", "-d", "-n"]:
        if rng.random() < 0.85:
            v, b = number()
            if not b and rng.random() < 0.5:
                v = rng.choice({"-E": ["8", "64", "512"], "-K": ["1", "2", "8"], "-d": ["64", "256"],
                                "-n": ["64", "128"]}[opt])
            args += [opt, v]
            bad |= b
    if rng.random() < 0.3:
        v, b = number()
        args += ["--route-scale", v]
        bad |= b
    if rng.random() < 0.3:
        args += ["--activation", rng.choice(TEXT)]
    if rng.random() < 0.2:
        args += ["--router", rng.choice(TEXT)]
    if with_tokens and rng.random() < 0.8:
        v, b = number()
        args += ["-T", v]
        bad |= b
    return bad


def cache_path():
    choice = rng.random()
    if choice < 0.55:
        path = os.path.join(WORK, "cache.db")
        shutil.copyfile(CACHE, path)
        return path, True
    return rng.choice([fifo, noise, folder, "/dev/null", os.path.join(WORK, "missing", "x.db"), ""]), False


def draw():
    """(argv, must_exit_2, read_only_cache_path or None)."""
    cmd = rng.choice(["plan", "generate", "tune", "forward-check", "grad-check", "bench", "regress", "cache", "presets"])
    args, bad, watch = [cmd], False, None
    long_running = cmd in ("tune", "forward-check", "grad-check", "bench", "regress")
    if cmd == "plan":
        bad |= shape_options(args, True)
    elif cmd == "generate":
        args.append("--check-only")  # never compile: keeps each run short
        bad |= shape_options(args, False)
        for _ in range(rng.randrange(3)):
            args += ["--tile", f"{rng.choice(FAMILIES)}={rng.choice(TILES)}"]
    elif cmd in ("forward-check", "grad-check", "bench"):
        bad |= shape_options(args, True)
        opt = {"forward-check": "--samples", "grad-check": "--samples", "bench": "--steps"}[cmd]
        args += [opt, rng.choice(NOT_NUMBERS)]
        bad = True
        if rng.random() < 0.3:
            args += ["--mode", rng.choice(TEXT)]
    elif cmd == "tune":
        bad |= shape_options(args, True)
        for opt in rng.sample(["--budget", "--samples", "--candidates"], rng.randrange(1, 4)):
            args += [opt, rng.choice(EDGES)]
        args += [rng.choice(["--budget", "--samples", "--candidates"]), rng.choice(NOT_NUMBERS)]
        bad = True
        args += ["--db", os.path.join(WORK, "tune.db")]
    elif cmd == "regress":
        baseline = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "baselines", "qwen3-30b-a3b.json")
        args += ["--baseline", rng.choice([baseline, fifo, folder, noise, "/dev/null", os.path.join(WORK, "none")])]
        args += [rng.choice(["--tolerance", "--samples"]), rng.choice(NOT_NUMBERS)]
        bad = True
    elif cmd == "cache":
        sub = rng.choice(["list", "show", "verify", "gc", "export", "import"])
        args.append(sub)
        path, real = cache_path()
        args += ["--db", path]
        if sub == "gc":
            v, b = number()
            args += ["--max-mb", v]
            bad |= b
        elif sub in ("export", "import"):
            args.append(rng.choice([fifo, noise, folder, "/dev/null", os.path.join(WORK, f"out{rng.randrange(9)}.db")]))
        elif real and sub in ("list", "show", "verify"):
            watch = path
    if rng.random() < 0.2:
        args.append("--json")
    if rng.random() < 0.05:
        args.append(rng.choice(["--no-such-option", "-Z", "--", "extra"]))
    if long_running and not bad:
        raise AssertionError("a long-running command without a bad number")
    return args, bad, watch


def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


failures = []
for i in range(runs):
    argv, must_2, watch = draw()
    before = digest(watch) if watch else None
    try:
        p = subprocess.run([BIN] + argv, capture_output=True, timeout=60, env={**os.environ, "MOEBLAZE_CACHE": os.path.join(WORK, "default.db")})
        rc, err = p.returncode, p.stderr.decode(errors="replace")
    except subprocess.TimeoutExpired:
        failures.append(f"run {i}: timed out: {argv!r}")
        continue
    problems = []
    if rc not in (0, 1, 2, 3):
        problems.append(f"exit code {rc}")
    if must_2 and rc != 2:
        problems.append(f"a value that is not a finite number exited {rc}, not 2")
    if rc in (1, 2, 3) and "error:" not in err:
        problems.append("no 'error:' line")
    if watch and digest(watch) != before:
        problems.append("a read-only command changed the cache file")
    if problems:
        failures.append(f"run {i}: {'; '.join(problems)}: {argv!r}\n    stderr: {err.strip()[:300]}")

for f in failures[:20]:
    print(f)
if failures:
    print(f"fuzz: {len(failures)} of {runs} runs failed (seed {seed})")
    sys.exit(1)
print(f"fuzz: {runs} runs, all exit codes documented (seed {seed})")
