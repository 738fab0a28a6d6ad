#!/usr/bin/env python3
"""Reads the SASS of moeblaze's cached kernels and of QuACK's (SonicMoE's) beside them, without a
GPU: nvdisasm comes as the `nvidia-cuda-nvdisasm` PyPI wheel.

    python3 bench/sass.py cache CACHE.db --kernel 'mb_down_wgrad_%' --out DIR
    python3 bench/sass.py quack QUACK_CACHE_DIR --out DIR
    python3 bench/sass.py loops DIR/*.sass [--opcodes LDGSTS,SHFL,HGMMA]

`cache`: the cubins of a moeblaze cache whose kernel name matches (SQL LIKE), disassembled into
DIR/<kernel>.sass. `quack`: the cubin each QuACK host object (`quack_cache/**/*.o`) embeds (an
ELF with e_machine 190 inside it), disassembled into DIR/<object>.sass with the kernel's name on
its first line. `loops`: each file's loops (a backward branch and the instructions it jumps
over): their length and how many of each opcode of --opcodes they hold; a producer's k-step or
a consumer's k-loop is read off as one of them (docs/performance.md). nvdisasm: --nvdisasm, else
$NVDISASM, else on PATH, else the wheel's (pip install nvidia-cuda-nvdisasm).
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import sqlite3
import struct
import subprocess
import sys
import sysconfig
from pathlib import Path

CUDA_MACHINE = 190  # e_machine of an NVIDIA cubin
DEFAULT_OPCODES = "LDGSTS,LDG,SHFL,HGMMA,UTMALDG,SYNCS,BAR,ISETP,IMAD"


def nvdisasm_path(explicit: str | None = None) -> str:
    for cand in (explicit, os.environ.get("NVDISASM"), shutil.which("nvdisasm")):
        if cand and Path(cand).is_file():
            return cand
    for site in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}:
        for found in sorted(Path(site).glob("nvidia/cu*/bin/nvdisasm")):
            return str(found)
    raise SystemExit("sass: no nvdisasm (pass --nvdisasm, set NVDISASM, or pip install nvidia-cuda-nvdisasm)")


def embedded_cubin(blob: bytes) -> bytes | None:
    """The first NVIDIA ELF inside `blob` past offset 0 (a host object's embedded cubin), cut to
    the end of its last section, program header or section table; None if there is none."""
    at = blob.find(b"\x7fELF", 1)
    while at >= 0:
        if len(blob) >= at + 64 and struct.unpack_from("<H", blob, at + 18)[0] == CUDA_MACHINE:
            phoff, shoff = struct.unpack_from("<QQ", blob, at + 0x20)
            phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", blob, at + 0x36)
            end = max(shoff + shentsize * shnum, phoff + phentsize * phnum)
            for k in range(shnum):
                sh = at + shoff + k * shentsize
                sh_type = struct.unpack_from("<I", blob, sh + 4)[0]
                offset, size = struct.unpack_from("<QQ", blob, sh + 0x18)
                if sh_type != 8:  # SHT_NOBITS takes no bytes in the file
                    end = max(end, offset + size)
            for k in range(phnum):
                ph = at + phoff + k * phentsize
                offset = struct.unpack_from("<Q", blob, ph + 8)[0]
                filesz = struct.unpack_from("<Q", blob, ph + 0x20)[0]
                end = max(end, offset + filesz)
            return blob[at:at + end]
        at = blob.find(b"\x7fELF", at + 4)
    return None


def disassemble(nvdisasm: str, cubin: Path) -> str:
    out = subprocess.run([nvdisasm, "-c", str(cubin)], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"sass: nvdisasm failed on {cubin}: {out.stderr.strip()[:300]}")
    return out.stdout


INSTR = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)(\.[A-Z0-9_.]+)?\s*(.*?);")
BRANCH_TARGET = re.compile(r"`\((\.L_x_\d+)\)")
LABEL = re.compile(r"^(\.L_x_\d+):")


def parse(text: str) -> tuple[list[tuple[int, str, str]], dict[str, int]]:
    """(instructions as (index, opcode, operands), label -> index of the next instruction)."""
    instrs, labels, pending = [], {}, []
    for line in text.splitlines():
        m = LABEL.match(line.strip())
        if m:
            pending.append(m.group(1))
            continue
        m = INSTR.search(line)
        if m:
            for lab in pending:
                labels[lab] = len(instrs)
            pending = []
            instrs.append((len(instrs), m.group(3), m.group(5)))
    return instrs, labels


def loops(text: str, opcodes: list[str]) -> list[dict]:
    """Every backward branch's body [target, branch]: its length and opcode counts."""
    instrs, labels = parse(text)
    out = []
    for i, op, args in instrs:
        if op not in ("BRA", "JMP"):
            continue
        m = BRANCH_TARGET.search(args)
        if not m or labels.get(m.group(1), i + 1) > i:
            continue
        start = labels[m.group(1)]
        body = [o for _, o, _ in instrs[start:i + 1]]
        out.append({"start": start, "end": i, "length": len(body), **{o: body.count(o) for o in opcodes}})
    return out


def cmd_cache(a) -> int:
    if not Path(a.db).is_file():
        raise SystemExit(f"sass: cache: {a.db}: no such file")
    try:  # read-only: the cache is never written
        con = sqlite3.connect(f"file:{a.db}?mode=ro", uri=True)
        rows = con.execute("SELECT kernel_name, cubin FROM binaries WHERE kernel_name LIKE ? ORDER BY created",
                           (a.kernel,)).fetchall()
    except sqlite3.Error as e:
        raise SystemExit(f"sass: cache: {a.db} is not a readable moeblaze cache ({e})")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    nv = nvdisasm_path(a.nvdisasm)
    if not rows:
        print(f"sass: no kernel in {a.db} matches {a.kernel!r}", file=sys.stderr)
        return 1
    for name, cubin in rows:  # the newest of a name wins
        (out / f"{name}.cubin").write_bytes(cubin)
        (out / f"{name}.sass").write_text(disassemble(nv, out / f"{name}.cubin"))
    print(f"{len({r[0] for r in rows})} kernels disassembled into {out}")
    return 0


def cmd_quack(a) -> int:
    if not Path(a.dir).is_dir():
        raise SystemExit(f"sass: quack: {a.dir}: not a directory")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    nv = nvdisasm_path(a.nvdisasm)
    n = 0
    for obj in sorted(Path(a.dir).rglob("*.o")):
        cubin = embedded_cubin(obj.read_bytes())
        if cubin is None:
            continue
        stem = out / obj.stem[:16]
        stem.with_suffix(".cubin").write_bytes(cubin)
        text = disassemble(nv, stem.with_suffix(".cubin"))
        name = re.search(r"\.text\.(\S+?):", text)
        stem.with_suffix(".sass").write_text(f"// {name.group(1) if name else '?'}\n{text}")
        n += 1
    if not n:
        print(f"sass: quack: no host object under {a.dir} embeds a cubin", file=sys.stderr)
        return 1
    print(f"{n} QuACK kernels disassembled into {out}")
    return 0


def cmd_loops(a) -> int:
    opcodes = [o for o in a.opcodes.split(",") if o]
    missing = [f for f in a.files if not Path(f).is_file()]
    if missing:
        raise SystemExit(f"sass: loops: no such file: {', '.join(missing)}")
    if not opcodes:
        raise SystemExit("sass: loops: --opcodes names no opcode")
    for f in a.files:
        print(f"== {f}")
        print("  instrs " + " ".join(f"{o:>7}" for o in opcodes))
        for lp in loops(Path(f).read_text(), opcodes):
            if lp["length"] < a.min_length:
                continue
            print(f"  {lp['length']:6d} " + " ".join(f"{lp[o]:7d}" for o in opcodes))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nvdisasm", default=None)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("cache")
    c.add_argument("db")
    c.add_argument("--kernel", required=True, help="SQL LIKE pattern of kernel names, e.g. 'mb_down_wgrad_%%'")
    c.add_argument("--out", required=True)
    q = sub.add_parser("quack")
    q.add_argument("dir")
    q.add_argument("--out", required=True)
    lp = sub.add_parser("loops")
    lp.add_argument("files", nargs="+")
    lp.add_argument("--opcodes", default=DEFAULT_OPCODES)
    lp.add_argument("--min-length", type=int, default=20, help="shorter loops (barrier polls) are left out")
    a = ap.parse_args(argv)
    return {"cache": cmd_cache, "quack": cmd_quack, "loops": cmd_loops}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
