"""CPU checks of the held-out shapes (bench/heldout.json): outside the suite and the presets,
every kind the tuner must handle, and every default tile legal for each layer
(`moeblaze generate --check-only`, no GPU)."""
import json
import subprocess
from pathlib import Path

import pytest

from suite import moeblaze_cli

HERE = Path(__file__).resolve().parent
HELDOUT = json.loads((HERE / "heldout.json").read_text())["shapes"]
SUITE = json.loads((HERE / "suite.json").read_text())["shapes"]


def dims(s):
    return (s["E"], s["K"], s["d"], s["n"])


def test_at_least_six_shapes_of_every_kind():
    assert len(HELDOUT) >= 6
    kinds = {s["kind"] for s in HELDOUT}
    assert kinds == {"few-wide", "many-narrow", "deepseek-scale"}
    for s in HELDOUT:
        E, K, d, n = dims(s)
        assert 1 <= K <= E and d % 8 == 0 and n % 8 == 0, s["name"]
        assert s["T"] == (16384 if d >= 4096 else 32768), s["name"]
        want = {"few-wide": E <= 16 and n >= 4096, "many-narrow": E >= 40 and n <= 1536,
                "deepseek-scale": E >= 256 and d >= 7168}[s["kind"]]
        assert want, f"{s['name']} is not {s['kind']}"


def test_no_shape_is_a_suite_shape_or_a_preset():
    cli = moeblaze_cli()
    known = {dims(s) for s in SUITE}
    if cli.exists():  # the presets beyond the suite
        out = subprocess.run([str(cli), "presets"], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            f = dict(tok.split("=", 1) for tok in line.split() if "=" in tok)
            if {"E", "K", "d", "n"} <= f.keys():
                known.add((int(f["E"]), int(f["K"]), int(f["d"]), int(f["n"])))
    assert len({s["name"] for s in HELDOUT}) == len(HELDOUT)
    for s in HELDOUT:
        assert dims(s) not in known, s["name"]


@pytest.mark.parametrize("shape", HELDOUT, ids=[s["name"] for s in HELDOUT])
def test_every_default_tile_is_legal(shape):
    cli = moeblaze_cli()
    if not cli.exists():
        pytest.skip(f"{cli} not built")
    E, K, d, n = dims(shape)
    r = subprocess.run([str(cli), "generate", "-E", str(E), "-K", str(K), "-d", str(d), "-n", str(n),
                        "-T", str(shape["T"]), "--router", "softmax", "--check-only", "--json"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    kernels = json.loads(r.stdout)["kernels"]
    assert {k["family"] for k in kernels} >= {"gate_up", "down_proj", "down_dgrad", "down_wgrad", "gate_up_wgrad",
                                              "gate_up_dgrad"}
