#!/usr/bin/env bash
# Compares the PTX of every suite kernel between a git revision and this working tree, apart
# from line information: the check that a change outside the kernels (or a rename) leaves the
# device code as it was. No GPU needed (NVRTC only).
#
# Usage: scripts/ptx_diff.sh [--ref-bin PATH] [--keep DIR] REF
#        scripts/ptx_diff.sh --compare DIR
#   REF            a revision (main, a commit): exported (git archive) into a temporary folder
#                  and its `moeblaze` built there (target moeblaze only)
#   --ref-bin      use this already built `moeblaze` for REF instead of building it
#   --keep DIR     keep the PTX of both sides under DIR (default: a temporary folder, removed)
#   --compare DIR  only compare what an earlier --keep DIR holds
# Environment: MOEBLAZE_BUILD_DIR (this tree's build folder, default build), MOEBLAZE_JOBS.
#
# For each suite preset (`moeblaze presets --json`, "suite": true) both sides run
# `moeblaze generate --preset P --ptx-dir DIR --json`; kernels are paired by family, so a
# renamed tile or kernel still pairs, and a family under its older name (docs/design.md,
# "Glossary") pairs with itself under today's. Before comparing, each PTX loses its `.loc` and
# `.file` lines, its debug sections and its comments, and the kernel's own name (also inside
# the mangled names NVRTC derives from the file name) becomes KERNEL; gemm::Tile's template
# arguments inside mangled names become #, and its static members' symbol declarations go.
# Exit 0: every kernel is identical; 1: some differ (named, with the first lines of the
# difference); 2: usage.
set -euo pipefail
cd "$(dirname "$0")/.."
ref_bin="" keep="" compare=""
while [ $# -gt 0 ]; do
  case $1 in
    --compare) compare=$2; shift 2 ;;
    --ref-bin) ref_bin=$2; shift 2 ;;
    --keep) keep=$2; shift 2 ;;
    -h|--help) sed -n '2,23p' "$0" | cut -c3-; exit 0 ;;
    -*) echo "ptx_diff: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
compare_ptx() {  # compare_ptx DIR PRESET...
python3 - "$@" <<'PY'
import difflib, json, re, sys
from pathlib import Path

out, presets = Path(sys.argv[1]), sys.argv[2:]
# Families under their older names (docs/design.md, "Glossary"), as an older reference
# revision writes them.
OLDER_FAMILY = {"up_proj": "gate_up", "up_wgrad": "gate_up_wgrad", "up_dgrad": "gate_up_dgrad"}
# gemm::Tile's members under their older names: every static member of the tile is a global
# symbol of the kernel's PTX, mangled as ...4TileI<arguments>E<length><name>E.
OLDER_TILE_MEMBER = {"TMA": "TMA_CONTIGUOUS", "SWAP": "ALT_ORDER", "TSTORE": "TMA_STORE"}
OLDER_TILE_MEMBER_RE = re.compile(r"(4TileI(?:Li\d+E)+E)(%s)E" % "|".join(f"{len(k)}{k}" for k in OLDER_TILE_MEMBER))

TILE_ARGS_RE = re.compile(r"4TileI(?:Li-?\d+E)+E")
TILE_MEMBER_DECL_RE = re.compile(r"\.global \.align \d+ \.(?:u8|u32|b8|b32) _ZN8moeblaze4gemm4TileI#E\d+\w+E(?: = [^;]+)?;$")

def today_names(s):
    def renamed(m):
        new = OLDER_TILE_MEMBER[m.group(2).lstrip("0123456789")]
        return f"{m.group(1)}{len(new)}{new}E"
    return OLDER_TILE_MEMBER_RE.sub(renamed, s)

def normalized(path, kernel):
    lines, depth, in_debug = [], 0, False
    for line in path.read_text().splitlines():
        s = line.strip()
        if in_debug:  # a debug section's { ... } block
            depth += s.count("{") - s.count("}")
            if depth <= 0 and "}" in s:
                in_debug = False
            continue
        if s.startswith(".section") and ".debug" in s:
            in_debug, depth = True, 0
            continue
        if s.startswith((".loc", ".file", "//")) or not s:
            continue
        s = s.split("//")[0].rstrip()
        s = s.replace(kernel, "KERNEL")
        s = re.sub(r"_ZN\d+_INTERNAL_\w+?_KERNEL_cu_[0-9a-f]+", "_ZN_INTERNAL_", s)
        s = today_names(s)
        # gemm::Tile's template arguments (a new defaulted one changes every mangled name) and its
        # static members' global symbols (constants the code reads as immediates): not code
        s = TILE_ARGS_RE.sub("4TileI#E", s)
        if TILE_MEMBER_DECL_RE.match(s):
            continue
        lines.append(s)
    return lines

differ, total = [], 0
for p in presets:
    sides = {}
    for side in ("ref", "new"):
        info = json.loads((out / f"{side}/{p}.json").read_text())
        sides[side] = {OLDER_FAMILY.get(k["family"], k["family"]): k["kernel"] for k in info["kernels"]}
    if sides["ref"].keys() != sides["new"].keys():
        differ.append(f"{p}: families differ: {sorted(sides['ref'])} vs {sorted(sides['new'])}")
        continue
    same = 0
    for family, ref_kernel in sides["ref"].items():
        new_kernel = sides["new"][family]
        a = normalized(out / f"ref/{p}/{ref_kernel}.ptx", ref_kernel)
        b = normalized(out / f"new/{p}/{new_kernel}.ptx", new_kernel)
        total += 1
        if a == b:
            same += 1
            continue
        head = list(difflib.unified_diff(a, b, ref_kernel, new_kernel, n=1, lineterm=""))[:12]
        differ.append(f"{p} {family}: {ref_kernel} -> {new_kernel}\n  " + "\n  ".join(head))
    print(f"{p}: {same} of {len(sides['ref'])} kernels identical apart from line information")
for d in differ:
    print("DIFFERS", d)
print(f"ptx_diff: {total - len(differ)} of {total} kernels identical" if not differ else
      f"ptx_diff: {len(differ)} kernel(s) differ")
sys.exit(1 if differ else 0)
PY
}
if [ -n "$compare" ]; then
  compare_ptx "$compare" $(cd "$compare/new" && ls *.json | sed 's/\.json$//')
  exit
fi
[ $# -eq 1 ] || { sed -n '6,12p' "$0" | cut -c3- >&2; exit 2; }
ref=$1
jobs=${MOEBLAZE_JOBS:-$(nproc)}
build=${MOEBLAZE_BUILD_DIR:-build}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
out=${keep:-$work/ptx}
mkdir -p "$out"

if [ -z "$ref_bin" ]; then
  git rev-parse --verify --quiet "$ref^{commit}" >/dev/null || { echo "ptx_diff: '$ref' is not a revision" >&2; exit 2; }
  ref_tree=$work/ref
  mkdir -p "$ref_tree"
  git archive "$ref" | tar -x -C "$ref_tree"
  echo "ptx_diff: building $ref ($(git rev-parse --short "$ref")) in $ref_tree"
  cmake -S "$ref_tree" -B "$ref_tree/build" -DCMAKE_BUILD_TYPE=Release -DMOEBLAZE_BUILD_TESTS=OFF \
    -DMOEBLAZE_BUILD_C_LIBRARY=OFF > "$work/ref-configure.log" || { cat "$work/ref-configure.log"; exit 1; }
  cmake --build "$ref_tree/build" --target moeblaze -j "$jobs" > "$work/ref-build.log" 2>&1 ||
    { tail -30 "$work/ref-build.log"; exit 1; }
  ref_bin=$ref_tree/build/bin/moeblaze
fi
echo "ptx_diff: building this tree ($build)"
cmake --build "$build" --target moeblaze -j "$jobs" > "$work/build.log" 2>&1 || { tail -30 "$work/build.log"; exit 1; }
new_bin=$build/bin/moeblaze

presets=$("$new_bin" presets --json | python3 -c 'import json, sys; print(" ".join(p["name"] for p in json.load(sys.stdin) if p["suite"]))')
for p in $presets; do
  for side in ref new; do
    bin=$ref_bin
    [ $side = new ] && bin=$new_bin
    mkdir -p "$out/$side"
    "$bin" generate --preset "$p" --ptx-dir "$out/$side/$p" --json > "$out/$side/$p.json"
  done
done

compare_ptx "$out" $presets
