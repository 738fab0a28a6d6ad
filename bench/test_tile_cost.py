"""CPU tests of bench/tile_cost.py: the per-tile cost fit recovers a known model."""
import json

from tile_cost import fit_line, tile_costs, tile_geometry

SHAPES = json.loads(open(__import__("pathlib").Path(__file__).with_name("suite.json")).read())["shapes"]


def test_fit_line_recovers_slope_and_intercept():
    a, b, resid = fit_line([(8, 8 * 0.9 + 7), (32, 32 * 0.9 + 7), (64, 64 * 0.9 + 7)])
    assert abs(a - 0.9) < 1e-9 and abs(b - 7) < 1e-9 and resid < 1e-12


def test_geometry_of_a_weight_gradient():
    deepseek = next(s for s in SHAPES if s["name"] == "deepseek-v3")
    tiles, k_steps, flops = tile_geometry("down_wgrad", deepseek, 128, 256)
    assert tiles == 256 * (7168 // 128) * (2048 // 256)  # E x d/BM x n/BN
    assert k_steps == 8  # 16384 * 8 / 256 = 512 slots per expert
    assert flops == 2 * 128 * 256 * 64


def test_tile_costs_recover_a_synthetic_run():
    overhead, step = 6.0, 0.9  # us per tile, us per k-step
    kernels = {}
    for s in SHAPES:
        tiles, k_steps, _ = tile_geometry("gate_up_wgrad", s, 128, 256)
        ms = tiles * (overhead + step * k_steps) / 132 / 1e3
        kernels[s["name"]] = {"kernels": [{"family": "gate_up_wgrad", "tile": "128x256x64_w8x1_s4_persist_tmacontig", "ms": ms},
                                          {"family": "combine", "tile": "-", "ms": 1.0}]}
    rows = tile_costs({"kernels": kernels}, SHAPES)
    assert len(rows) == 1
    family, tile, b, a, tflops, resid, points = rows[0]
    assert family == "gate_up_wgrad" and len(points) == len(SHAPES)
    assert abs(b - overhead) < 1e-6 and abs(a - step) < 1e-6 and resid < 1e-9
    assert abs(tflops - 2 * 128 * 256 * 64 / (step * 1e-6) * 132 / 1e12) < 1e-6


def test_tile_costs_read_a_run_recorded_under_the_older_family_names():
    kernels = {}
    for s in SHAPES:
        tiles, k_steps, _ = tile_geometry("gate_up_wgrad", s, 128, 256)
        kernels[s["name"]] = {"kernels": [{"family": "up_wgrad", "tile": "128x256x64_w8x1_s4_wsp_tma",
                                           "ms": tiles * (6.0 + 0.9 * k_steps) / 132 / 1e3}]}
    rows = tile_costs({"kernels": kernels}, SHAPES)
    assert [r[0] for r in rows] == ["gate_up_wgrad"]
