"""CPU checks of bench/quack_configs.py on QuACK's autotune-file format: the winner first, the
family named from the layer's n, and folders and archives read alike."""
import io
import json
import tarfile

import pytest

import quack_configs

N = 14336  # mixtral-8x7b's n


def autotune(kind_shapes, timings):
    key = ["False"] + [f"torch.Size({list(s)})" for s in kind_shapes] + ["torch.int32"]
    cfg = ("config: GemmConfig(tile_m={m}, tile_n={n}, pingpong={pp}, is_dynamic_persistent=False, "
           "cluster_m={cm}, cluster_n={cn}, swap_ab=False, max_swizzle_size=8, device_capacity=9, use_tma_gather=False)")
    return json.dumps({"key": key, "configs_timings": [[cfg.format(**c), t] for c, t in timings]})


FILES = {
    # a weight gradient (3-D output), N = n: down_wgrad; the faster config listed second
    "A/gemm_tuned.autotune.json": autotune(
        [(4096, 16384), (32768, N), (8, 4096, N)],
        [({"m": 128, "n": 256, "pp": False, "cm": 1, "cn": 1}, [6.0, 6.1]),
         ({"m": 256, "n": 128, "pp": False, "cm": 2, "cn": 1}, [5.2, 5.16])]),
    # a per-slot GEMM whose A has G n columns: gate_up_dgrad
    "B/gemm_tuned.autotune.json": autotune(
        [(32768, 2 * N), (8, 2 * N, 4096), (32768, 4096)],
        [({"m": 192, "n": 128, "pp": True, "cm": 1, "cn": 2}, [10.7])]),
    # another shape's GEMM: left out with --shape
    "C/gemm_gated_tuned.autotune.json": autotune(
        [(32768, 2048), (128, 2048, 1536), (262144, 1536)],
        [({"m": 128, "n": 256, "pp": False, "cm": 2, "cn": 1}, [2.5])]),
}


@pytest.fixture(params=["folder", "archive"])
def source(tmp_path, request):
    if request.param == "folder":
        for name, text in FILES.items():
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / name).write_text(text)
        return tmp_path
    path = tmp_path / "quack_cache_new.tgz"
    with tarfile.open(path, "w:gz") as tar:
        for name, text in FILES.items():
            data = text.encode()
            info = tarfile.TarInfo("./" + name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_families_and_winners(source, capsys):
    assert quack_configs.main([str(source), "--shape", "mixtral-8x7b", "--top", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    heads = [line.split()[0] for line in out if not line.startswith(" ")]
    assert sorted(heads) == ["down_wgrad", "gate_up_dgrad"]  # qwen3's gate_up left out
    i = next(k for k, line in enumerate(out) if line.startswith("down_wgrad"))
    assert "256x128 cooperative pair along M" in out[i + 1] and "5.160" in out[i + 1]  # the winner first
    assert "128x256 cooperative" in out[i + 2]
    j = next(k for k, line in enumerate(out) if line.startswith("gate_up_dgrad"))
    assert "192x128 ping-pong pair along N" in out[j + 1]


def test_without_shape_lists_every_gemm(source, capsys):
    assert quack_configs.main([str(source)]) == 0
    out = capsys.readouterr().out
    assert out.count("ms\n") == 4 and "gemm_gated" in out


def test_missing_source_is_named(tmp_path):
    with pytest.raises(SystemExit, match="no such file or folder"):
        quack_configs.main([str(tmp_path / "nothing.tgz")])
