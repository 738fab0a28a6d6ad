"""CPU tests of bench/peers.py: finding a peer's folder, and a missing or failing peer
reported with its reason instead of raised."""
import pytest

import peers


@pytest.fixture(autouse=True)
def clean(monkeypatch, tmp_path):
    peers._loaded.clear()
    monkeypatch.setenv("SONIC_SITE", str(tmp_path / "sonic-site"))  # never an earlier run's unpacked payload
    monkeypatch.setenv("MB_SITE", str(tmp_path / "mb-site"))
    yield
    peers._loaded.clear()


def make_peer(root, name, payload=True, body="def _load():\n    return 1\n"):
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "peer.py").write_text(body)
    (folder / "install.sh").write_text("#!/bin/bash\n")
    if payload:
        for f in peers.PAYLOADS[name][0]:
            (folder / f).write_bytes(b"x")
    return folder


def test_missing_folder_says_where_and_how_to_fix(tmp_path):
    why = peers.problem("sonicmoe", tmp_path / "nowhere")
    assert "peer folder" in why and "nowhere/sonicmoe" in why and "--peers" in why


def test_missing_files_and_payload_are_named(tmp_path):
    folder = make_peer(tmp_path, "megablocks", payload=False)
    assert "no payload (mb-site.tar.gz)" in peers.problem("megablocks", tmp_path)
    (folder / "peer.py").unlink()
    assert "has no peer.py" in peers.problem("megablocks", tmp_path)
    assert "unknown peer 'scattermoe'" in peers.problem("scattermoe", tmp_path)


def test_sonic_payload_may_come_in_two_parts_or_be_unpacked_already(tmp_path, monkeypatch):
    folder = make_peer(tmp_path, "sonicmoe", payload=False)
    assert "no payload" in peers.problem("sonicmoe", tmp_path)
    (folder / "part1").write_bytes(b"1")
    assert "no payload" in peers.problem("sonicmoe", tmp_path)
    (folder / "part2").write_bytes(b"2")
    assert peers.problem("sonicmoe", tmp_path) is None
    (folder / "part1").unlink()
    site = tmp_path / "sonic-site"
    site.mkdir()
    (site / ".installed").write_text("sha\n")
    assert peers.problem("sonicmoe", tmp_path) is None


def test_a_complete_peer_loads_once(tmp_path):
    make_peer(tmp_path, "sonicmoe", body="calls = []\ndef _load():\n    calls.append(1)\n")
    p = peers.load("sonicmoe", tmp_path)
    assert p.ok and p.reason is None and p.module.calls == [1]
    assert peers.load("sonicmoe", tmp_path) is p and p.module.calls == [1]


def test_a_failing_install_becomes_the_reason(tmp_path):
    body = "import subprocess\ndef _load():\n    raise subprocess.CalledProcessError(3, ['bash', 'install.sh'])\n"
    make_peer(tmp_path, "megablocks", body=body)
    p = peers.load("megablocks", tmp_path)
    assert not p.ok and "install.sh failed with exit code 3" in p.reason


def test_an_import_error_becomes_the_reason(tmp_path):
    make_peer(tmp_path, "sonicmoe", body="def _load():\n    import no_such_package_here\n")
    p = peers.load("sonicmoe", tmp_path)
    assert not p.ok and "ModuleNotFoundError" in p.reason and "no_such_package_here" in p.reason


def test_both_peers_named_peer_py_stay_apart(tmp_path):
    make_peer(tmp_path, "sonicmoe", body="WHO = 'sonic'\ndef _load():\n    pass\n")
    make_peer(tmp_path, "megablocks", body="WHO = 'mb'\ndef _load():\n    pass\n")
    assert peers.load("sonicmoe", tmp_path).module.WHO == "sonic"
    assert peers.load("megablocks", tmp_path).module.WHO == "mb"


def test_default_root_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("MOEBLAZE_PEERS", raising=False)
    assert peers.default_root() == peers.REPO / ".peers"
    monkeypatch.setenv("MOEBLAZE_PEERS", str(tmp_path))
    assert peers.default_root() == tmp_path


def test_the_shared_peers_folder_is_complete_where_it_exists():
    # On the development machines the originals live in /work/shared/peers: the suite must
    # accept them as they are (their file names are what PAYLOADS expects).
    from pathlib import Path
    root = Path(peers.SOURCE)
    if not root.is_dir():
        pytest.skip("no shared peers folder here")
    for name in peers.PAYLOADS:
        assert peers.problem(name, root) is None, name

