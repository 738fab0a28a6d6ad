"""CPU tests of bench/ncu_source.py on small raw and source pages written the way ncu writes them."""
import csv
import gzip

import pytest

import ncu_source


def write_gz(path, rows):
    with gzip.open(path, "wt", newline="") as f:
        csv.writer(f).writerows(rows)
    return path


def test_kernels_reads_each_metric_in_its_unit(tmp_path, capsys):
    raw = write_gz(tmp_path / "p_raw.csv.gz", [
        ["ID", "Kernel Name", "gpu__time_duration.sum", "smsp__inst_executed.sum", "lts__t_sector_hit_rate.pct",
         "dram__bytes.sum.per_second"],
        ["", "", "us", "inst", "%", "Gbyte/s"],
        ["0", "mb_gate_up_E8", "1,500.5", "2000000", "40.0", "3540"],
        ["1", "k" * 200, "3.0", "1000000", "50.0", "n/a"],
    ])
    assert ncu_source.main(["kernels", str(raw)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "| kernel | ms | tensor % | instr M | L2 hit % | DRAM TB/s |"
    assert out[2] == "| mb_gate_up_E8 | 1.500 | - | 2 | 40.0 | 3.54 |"  # us -> ms, Gbyte/s -> Tbyte/s
    assert out[3].startswith("| " + "k" * 89 + "… | 0.003 |") and out[3].endswith("| - |")


def test_convert_refuses_other_kinds():
    assert ncu_source.convert(2.0, "ms", "%") is None
    assert ncu_source.convert(2.0, "ms", "us") == pytest.approx(2000.0)
    assert ncu_source.convert(2.0, "msecond", "ms") == pytest.approx(2.0)
    assert ncu_source.convert(1.0, "byte/s", "Tbyte/s") == pytest.approx(1e-12)
    assert ncu_source.convert(1.0, "byte", "Tbyte/s") is None
    assert ncu_source.convert(1.0, "furlong", "ms") is None


def source_rows(name, body):
    header = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed"]
    return [["Kernel Name", name, ""], header] + [[f"0x{16 * k:x}", src, str(s), str(n)] for k, (src, s, n) in enumerate(body)]


def test_loops_finds_a_mainloop_body_and_its_stalls(tmp_path, capsys):
    # 2 setup instructions, a 4-instruction loop run 1000 times, a cold instruction, a 2-instruction
    # spin loop run 5000 times; a second kernel that the regex leaves out
    body = [("S2R R0, SR_TID.X", 1, 10), ("MOV R1, 0x0", 0, 10),
            ("SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R8]", 50, 1000), ("@!P0 BRA 0x10", 300, 1000),
            ("HGMMA.64x192x16.F32.BF16 R24, gdesc[UR8], R24", 40, 1000), ("BRA 0x20", 5, 1000),
            ("EXIT", 0, 10), ("YIELD", 2, 5000), ("@!P0 BRA 0x80", 2, 5000)]
    src = write_gz(tmp_path / "p_source.csv.gz", source_rows("mb_gate_up_E8", body) +
                   source_rows("mb_down_proj_E8", [("NOP", 0, 5)]))
    assert ncu_source.main(["loops", str(src), "--kernel", "gate_up", "--min-share", "0.01"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "mb_gate_up_E8: 0M warp instructions, 9 in the code"
    assert len(out) == 3  # the setup and EXIT are cold; the down_proj kernel is left out
    assert out[1].startswith("  [2-5] 4 instructions a pass x 1000: 28.5% of instructions, 98.8% of samples")
    assert "300 x @!P0 BRA 0x10" in out[1]
    assert out[2].startswith("  [7-8] 2 instructions a pass x 5000: 71.3% of instructions")


def test_loops_says_when_no_kernel_matches(tmp_path, capsys):
    src = write_gz(tmp_path / "s.csv.gz", source_rows("mb_gate_up_E8", [("NOP", 0, 5)]))
    assert ncu_source.main(["loops", str(src), "--kernel", "nosuch"]) == 1
    assert "no kernel matches" in capsys.readouterr().err


def test_a_file_that_is_not_a_page_is_refused(tmp_path, capsys):
    bad = write_gz(tmp_path / "x_raw.csv.gz", [["a", "b"], ["1", "2"]])
    assert ncu_source.main(["kernels", str(bad)]) == 2
    assert "not an ncu raw page" in capsys.readouterr().err
