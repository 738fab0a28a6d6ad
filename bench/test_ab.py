"""CPU tests of bench/ab.py: variant parsing, the alternating order, the summary's medians and
ratios, and a whole run against a stand-in `moeblaze` that answers like the real one."""
import json
import stat
import sys
from pathlib import Path

import pytest

import ab


def test_parse_variant_takes_spaces_or_commas():
    assert ab.parse_variant("t=down_proj=A gate_up_dgrad=B") == ("t", ["down_proj=A", "gate_up_dgrad=B"])
    assert ab.parse_variant("t=down_proj=A,gate_up_dgrad=B") == ("t", ["down_proj=A", "gate_up_dgrad=B"])


@pytest.mark.parametrize("bad", ["t", "=down_proj=A", "t=", "default=down_proj=A", "t=down_proj", "t=down_proj="])
def test_parse_variant_refuses_malformed(bad):
    with pytest.raises(ValueError):
        ab.parse_variant(bad)


def test_schedule_alternates_default_and_variants_in_rounds():
    assert ab.schedule({"p": {"x": [], "y": []}}, 2) == [("p", "default", 0), ("p", "x", 0), ("p", "y", 0),
                                                         ("p", "default", 1), ("p", "x", 1), ("p", "y", 1)]


def test_derive_appends_the_suffix_to_warp_specialised_tiles_only():
    assert ab.parse_derive("direct=_directarrive") == ("direct", "_directarrive")
    for bad in ["direct", "direct=directarrive", "default=_x", "=_x", "d=_a=b"]:
        with pytest.raises(ValueError):
            ab.parse_derive(bad)
    defaults = {"gate_up": "128x128x64_w8x1_s4_persist_tmacontig", "router_logits": "128x64x64_w8x1_s4_wgmma",
                "gate_up_dgrad": "128x256x64_w8x1_s4_ws_tmacontig", "router_wgrad": "128x256x64_w8x1_s4_ws",
                "down_dgrad": "128x128x64_w8x1_s3_wgmma"}
    assert ab.derived_tiles(defaults, "_directarrive") == [
        "gate_up=128x128x64_w8x1_s4_persist_tmacontig_directarrive",
        "gate_up_dgrad=128x256x64_w8x1_s4_ws_tmacontig_directarrive",
        "router_wgrad=128x256x64_w8x1_s4_ws_directarrive"]


def run(variant, step, down, gate, tile="T0"):
    return {"preset": "p", "variant": variant, "step_ms": step,
            "kernels": {"gate_up": (gate, "G"), "down_proj": (down, tile)}}


def test_summary_medians_ratios_and_changed_families():
    runs = [run("default", 10.0, 2.0, 3.0), run("x", 8.0, 1.0, 3.0, "T1"),
            run("default", 12.0, 2.2, 3.0), run("x", 9.0, 1.2, 3.0, "T1"), run("default", 11.0, 2.1, 3.0)]
    s = ab.summarize(runs)["p"]
    assert s["default"]["step_ms"] == 11.0 and s["x"]["step_ms"] == 8.5
    assert s["x"]["step_ratio"] == pytest.approx(11.0 / 8.5)
    assert s["x"]["kernel_ratio"]["down_proj"] == pytest.approx(2.1 / 1.1)
    assert ab.changed_families(s) == ["down_proj"]  # gate_up kept its tile
    text = ab.table({"p": s})
    assert "| x | 8.50 (n=2) | 1.294x | 1.100 (1.909x) |" in text
    assert "- x: down_proj=T1" in text and "gate_up ms" not in text


def test_a_whole_run_against_a_stand_in(tmp_path):
    fake = tmp_path / "moeblaze"
    fake.write_text(f"""#!{sys.executable}
import json, sys
args = sys.argv[1:]
tiles = args[args.index("--tile") + 1:] if "--tile" in args else []
if any("ILLEGAL" in t for t in tiles):
    print("error: tile: not legal", file=sys.stderr); sys.exit(2)
if args[0] == "presets":
    print(json.dumps([{{"name": "p", "T": 4096}}])); sys.exit(0)
if args[0] == "generate" and "--json" in args:
    assert args[args.index("-T") + 1] == "4096"
    print(json.dumps({{"kernels": [{{"family": "down_proj", "tile": "base_ws"}}, {{"family": "combine", "tile": "-"}},
                                  {{"family": "router_logits", "tile": "r_wgmma"}}]}})); sys.exit(0)
if args[0] == "grad-check":
    print("PASS: max relative error 3.8e-03 (tolerance 1e-02)"); sys.exit(0)
if args[0] == "generate":
    sys.exit(0)
fast = any("fast" in t for t in tiles)
derived = any(t.endswith("_x") for t in tiles)
print(json.dumps({{"step_ms": 9.0 if fast else 9.5 if derived else 10.0, "kernels": [
    {{"family": "down_proj", "ms": 1.0 if fast else 2.0, "tile": "fast" if fast else "base_ws_x" if derived else "base_ws"}},
    {{"family": "combine", "ms": 0.3, "tile": "-"}}]}}))
""")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    out = tmp_path / "ab.json"
    rc = ab.main(["--preset", "p", "--variant", "f=down_proj=fast", "--variant", "bad=down_proj=ILLEGAL",
                  "--derive", "x=_x", "--rounds", "2", "--grad-check-tokens", "512", "--moeblaze", str(fake),
                  "--json", str(out)])
    assert rc == 0
    d = json.loads(out.read_text())
    assert d["variants"]["p"]["x"] == ["down_proj=base_ws_x"]  # the warp-specialised default only
    assert [(r["variant"], r["round"]) for r in d["runs"]] == [
        ("default", 0), ("f", 0), ("x", 0), ("default", 1), ("f", 1), ("x", 1)]
    assert d["summary"]["p"]["x"]["step_ratio"] == pytest.approx(10.0 / 9.5)
    assert d["summary"]["p"]["f"]["step_ratio"] == pytest.approx(10.0 / 9.0)
    assert d["summary"]["p"]["f"]["kernel_ratio"]["down_proj"] == pytest.approx(2.0)
    assert "bad" not in d["summary"]["p"]


def test_another_build_runs_its_own_binary_with_its_default_tiles(tmp_path):
    def stand_in(name: str, step: float) -> Path:
        f = tmp_path / name
        f.write_text(f"""#!{sys.executable}
import json, sys
args = sys.argv[1:]
assert "--tile" not in args, args
if args[0] == "presets":
    print(json.dumps([{{"name": "p", "T": 4096}}])); sys.exit(0)
if args[0] == "grad-check":
    print("PASS: max relative error 3.8e-03 (tolerance 1e-02)"); sys.exit(0)
if args[0] == "generate":
    sys.exit(0)
print(json.dumps({{"step_ms": {step}, "kernels": [{{"family": "down_proj", "ms": {step / 5}, "tile": "t_ws"}}]}}))
""")
        f.chmod(f.stat().st_mode | stat.S_IEXEC)
        return f

    base, other = stand_in("base", 10.0), stand_in("other", 8.0)
    out = tmp_path / "ab.json"
    assert ab.main(["--preset", "p", "--build", f"new={other}", "--grad-check-tokens", "512",
                    "--moeblaze", str(base), "--json", str(out)]) == 0
    s = json.loads(out.read_text())["summary"]["p"]
    assert s["default"]["step_ms"] == 10.0 and s["new"]["step_ms"] == 8.0
    assert s["new"]["kernel_ratio"]["down_proj"] == pytest.approx(1.25)
    assert "down_proj ms" in ab.table({"p": s}, every_family=True)


def test_a_missing_build_is_refused_by_name(tmp_path, capsys):
    with pytest.raises(SystemExit):
        ab.main(["--preset", "p", "--build", f"new={tmp_path / 'nothing'}"])
    assert "--build new=" in capsys.readouterr().err


def _logging_stand_in(path: Path, log: Path, fail_default: bool = False) -> Path:
    """A moeblaze whose grad-checks append their --tile arguments (or 'default') to `log`."""
    path.write_text(f"""#!{sys.executable}
import json, sys
args = sys.argv[1:]
tiles = args[args.index("--tile") + 1:] if "--tile" in args else []
if args[0] == "presets":
    print(json.dumps([{{"name": "p", "T": 4096}}])); sys.exit(0)
if args[0] == "grad-check":
    with open({str(log)!r}, "a") as f:
        f.write((" ".join(tiles) or "default") + "\\n")
    if {fail_default!r} and not tiles:
        print("FAIL: max relative error 3.0e-01 (tolerance 1e-02)"); sys.exit(1)
    print("PASS: max relative error 3.8e-03 (tolerance 1e-02)"); sys.exit(0)
if args[0] == "generate":
    sys.exit(0)
print(json.dumps({{"step_ms": 9.0 if tiles else 10.0, "kernels": [{{"family": "down_proj", "ms": 1.0, "tile": "t"}}]}}))
""")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def test_grad_checks_cover_the_defaults_and_skip_what_no_check_names(tmp_path):
    log = tmp_path / "checks.log"
    fake = _logging_stand_in(tmp_path / "moeblaze", log)
    out = tmp_path / "ab.json"
    assert ab.main(["--preset", "p", "--variant", "f=down_proj=fast", "--variant", "g=down_proj=other",
                    "--grad-check-tokens", "512", "--no-check", "g", "--moeblaze", str(fake), "--json", str(out)]) == 0
    assert log.read_text().split("\n")[:-1] == ["default", "down_proj=fast"]
    assert set(json.loads(out.read_text())["summary"]["p"]) == {"default", "f", "g"}


def test_defaults_that_fail_their_grad_check_drop_the_preset(tmp_path, capsys):
    fake = _logging_stand_in(tmp_path / "moeblaze", tmp_path / "checks.log", fail_default=True)
    assert ab.main(["--preset", "p", "--variant", "f=down_proj=fast", "--grad-check-tokens", "512",
                    "--moeblaze", str(fake)]) == 1  # nothing ran
    assert "the defaults fail their grad-check" in capsys.readouterr().out


def test_no_check_must_name_a_variant(tmp_path, capsys):
    fake = _logging_stand_in(tmp_path / "moeblaze", tmp_path / "checks.log")
    with pytest.raises(SystemExit):
        ab.main(["--preset", "p", "--no-check", "nosuch", "--moeblaze", str(fake)])
    assert "--no-check" in capsys.readouterr().err


def test_a_grad_check_past_the_deadline_drops_its_variant_without_a_traceback(tmp_path, capsys):
    fake = tmp_path / "moeblaze"
    fake.write_text(f"""#!{sys.executable}
import json, sys, time
args = sys.argv[1:]
tiles = args[args.index("--tile") + 1:] if "--tile" in args else []
if args[0] == "presets":
    print(json.dumps([{{"name": "p", "T": 4096}}])); sys.exit(0)
if args[0] == "grad-check":
    if any("slow" in t for t in tiles):
        time.sleep(30)
    print("PASS: max relative error 3.8e-03 (tolerance 1e-02)"); sys.exit(0)
if args[0] == "generate":
    sys.exit(0)
print(json.dumps({{"step_ms": 9.0 if tiles else 10.0, "kernels": [{{"family": "down_proj", "ms": 1.0, "tile": "t"}}]}}))
""")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    out = tmp_path / "ab.json"
    # The check takes the time that was left, so nothing is timed after it: an exit status of
    # 1 naming what happened, no traceback.
    assert ab.main(["--preset", "p", "--variant", "s=down_proj=slow", "--grad-check-tokens", "512", "--no-check",
                    "default", "--deadline-s", "15", "--moeblaze", str(fake), "--json", str(out)]) == 1
    assert "s: grad-check T=512: not finished within the deadline" in capsys.readouterr().out
