"""The training path with caches it cannot fully use, on a GPU: a damaged cache file is left as
it is and the layer runs without it (warning once), winners that do not name a tile fall back
to the default tiles (warning, bitwise the same output as without a cache), tune() destroys
the layer handles and the next step loads the tuned kernels, and weights on the CPU are named.
Skipped without torch or a GPU."""
import sqlite3

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

import moeblaze  # noqa: E402
import moeblaze.torch as mbt  # noqa: E402

E, K, D, N, T = 8, 2, 256, 128, 512


def _layer(seed=0):
    torch.manual_seed(seed)
    return mbt.MoE(E, K, D, N, device="cuda")


def _input(seed=1):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(T, D, device="cuda", dtype=torch.bfloat16, generator=g)


def _use_cache(monkeypatch, path):
    """Layers loaded from now on use the cache at `path` (the handles loaded so far are dropped)."""
    monkeypatch.setenv("MOEBLAZE_CACHE", str(path))
    mbt._release_layers()


def _output(m, x):
    y = m(x).y
    torch.cuda.synchronize()
    return y


def test_a_damaged_cache_is_left_alone_and_the_layer_runs_without_it(tmp_path, monkeypatch):
    db = tmp_path / "kernels.db"
    _use_cache(monkeypatch, db)
    m, x = _layer(), _input()
    y_cached = _output(m, x)  # compiles and stores the layer's kernels
    assert y_cached.float().abs().sum() > 0
    mbt._release_layers()
    size = db.stat().st_size
    with open(db, "r+b") as f:  # one page in the middle of the binaries' blobs
        f.seek((size // 4096 // 2) * 4096)
        f.write(b"\xff" * 4096)
    before = db.read_bytes()
    with pytest.warns(RuntimeWarning, match="running without the kernel cache.*damaged"):
        y = _output(m, x)
    assert torch.equal(y, y_cached)  # the same default kernels, compiled again
    assert db.read_bytes() == before  # not a byte of the user's file changed
    assert not list(tmp_path.glob("kernels.db.*"))  # nothing moved aside or started beside it
    mbt._release_layers()


def test_tune_destroys_handles_then_tuned_kernels_load_and_bad_winners_fall_back(tmp_path, monkeypatch):
    # One tuning run (the slow part) serves three checks.
    m, x = _layer(), _input()
    _use_cache(monkeypatch, tmp_path / "plain.db")
    y_default = _output(m, x)  # default tiles: no winners in this cache
    tuned_db = tmp_path / "tuned.db"
    _use_cache(monkeypatch, tuned_db)
    _output(m, x)
    assert len(mbt._layers) == 1
    reports = moeblaze.tune(m, tokens=[T], budget_s=60)
    assert reports and reports[0]["timed"], reports
    assert mbt._layers == {}  # tune() destroyed the handle it found loaded

    # The next step loads the tuned kernels.
    y_tuned = _output(m, x)
    assert len(mbt._layers) == 1
    rel = ((y_tuned.float() - y_default.float()).norm() / y_default.float().norm()).item()
    assert rel < 2e-2, rel  # tuned tiles may sum in another order, never to another result
    report = mbt.layer_report(m.cfg, m.route_scale, 0, T)
    assert "tuned" in report, report

    # Winners that do not name a tile: the default tiles, a warning, the same output bit for bit.
    mbt._release_layers()
    con = sqlite3.connect(tuned_db)
    assert con.execute("SELECT count(*) FROM winners").fetchone()[0] > 0, "tuning on a GPU stores winners"
    con.execute("UPDATE winners SET config = 'garbage' || char(27) || '[2J'")
    con.commit()
    con.close()
    with pytest.warns(RuntimeWarning, match="does not name a tile; using the default tile"):
        y = _output(m, x)
    assert torch.equal(y, y_default)
    mbt._release_layers()


def test_weights_on_the_cpu_are_named():
    m = mbt.MoE(E, K, D, N)  # no device: the weights stay on the CPU
    with pytest.raises(moeblaze.InvalidArgument) as e:
        m(_input())
    assert e.value.argument == "w1" and "is on cpu" in str(e.value)
