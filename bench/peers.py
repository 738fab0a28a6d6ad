"""The benchmark peers (SonicMoE, MegaBlocks): found in a copy of shared/peers/<name> inside
the checkout, loaded once, and reported rather than raised when missing or broken.

A peer folder holds `peer.py` (the adapter), `install.sh` (unpacks the payload into /tmp on
first use: peer.py runs it) and the payload. The folders travel to the GPU machine as an
ignored folder of the checkout, by default `.peers/` at the repository root
(`cp -r /work/shared/peers/sonicmoe /work/shared/peers/megablocks .peers/`); `--peers DIR` or
MOEBLAZE_PEERS names another. Both peer modules are called `peer.py`, so each is imported
under its own module name.

`load(name, root)` never raises: a Peer either carries the module or says why not, and the
suite writes that reason into the peer's rows. torch is not imported here until a peer is
loaded, so discovery is testable without a GPU."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Dict, Optional

REPO = Path(__file__).resolve().parent.parent
DEFAULT_ROOT = REPO / ".peers"
# The payload each peer's install.sh unpacks; any one alternative suffices. SonicMoE's may be
# split in two halves (part1 + part2) to fit a transfer limit.
PAYLOADS = {"sonicmoe": (("sonic-site.tar.xz",), ("part1", "part2")), "megablocks": (("mb-site.tar.gz",),)}
# Where peer.py unpacks it (its own default, overridable by the same variables).
SITES = {"sonicmoe": ("SONIC_SITE", "/tmp/sonic-site"), "megablocks": ("MB_SITE", "/tmp/mb-site")}
SOURCE = "/work/shared/peers"  # where the lead's machine keeps the originals (for the messages)


@dataclass
class Peer:
    name: str
    folder: Path
    module: Optional[ModuleType] = None
    reason: Optional[str] = None  # why the peer cannot run; None when module is set

    @property
    def ok(self) -> bool:
        return self.module is not None


def default_root() -> Path:
    return Path(os.environ.get("MOEBLAZE_PEERS", str(DEFAULT_ROOT)))


def installed(name: str) -> bool:
    """Whether an earlier run on this machine left the unpacked payload (peer.py then skips install.sh)."""
    var, default = SITES[name]
    return Path(os.environ.get(var, default), ".installed").is_file()


def problem(name: str, root: Path) -> Optional[str]:
    """Why the peer `name` under `root` cannot be loaded, judged from its files alone; None if it looks complete."""
    if name not in PAYLOADS:
        return f"unknown peer '{name}' (known: {', '.join(PAYLOADS)})"
    folder = Path(root) / name
    copy_hint = f"copy {SOURCE}/{name} to {folder}, or point --peers / MOEBLAZE_PEERS at a folder holding it"
    if not folder.is_dir():
        return f"peer folder {folder} not found ({copy_hint})"
    for f in ("peer.py", "install.sh"):
        if not (folder / f).is_file():
            return f"{folder} has no {f} ({copy_hint})"
    have_payload = any(all((folder / p).is_file() for p in alt) for alt in PAYLOADS[name])
    if not have_payload and not (name == "sonicmoe" and installed(name)):
        want = " or ".join(" + ".join(alt) for alt in PAYLOADS[name])
        return f"{folder} has no payload ({want}) ({copy_hint})"
    return None


_loaded: Dict[tuple, Peer] = {}


def load(name: str, root: Optional[Path] = None) -> Peer:
    """The peer, imported and unpacked (first call only; later calls return the same Peer,
    failed or not, so a broken peer costs one attempt per run)."""
    root = Path(root) if root is not None else default_root()
    key = (name, str(root.resolve()))
    if key not in _loaded:
        _loaded[key] = _load(name, root)
    return _loaded[key]


def _load(name: str, root: Path) -> Peer:
    folder = root / name
    why = problem(name, root)
    if why:
        return Peer(name, folder, reason=why)
    try:
        spec = importlib.util.spec_from_file_location(f"moeblaze_bench_peer_{name}", folder / "peer.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        module._load()  # unpacks (install.sh) and imports the peer's packages now, not inside a timed step
    except subprocess.CalledProcessError as e:
        return Peer(name, folder, reason=f"{folder}/install.sh failed with exit code {e.returncode} "
                                         f"(its message is in the log just before this row)")
    except Exception as e:  # noqa: BLE001 - any import failure becomes the peer's rows' reason
        return Peer(name, folder, reason=f"loading {folder}/peer.py failed: {type(e).__name__}: {e}")
    return Peer(name, folder, module=module)
