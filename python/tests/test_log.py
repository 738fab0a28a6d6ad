"""The `moeblaze` logger (moeblaze._log): MOEBLAZE_LOG_LEVEL, printing to stderr only while the
application has no logging of its own, the library's progress lines reaching it from its
compile threads, and tune() warning when nothing was timed. No GPU needed."""
import ctypes
import json
import logging
import os
import subprocess
import sys

import pytest

import moeblaze
from moeblaze import _capi as C
from moeblaze import _log


def _python(code, **env):
    e = dict(os.environ)
    e.pop("MOEBLAZE_LOG_LEVEL", None)
    e.update(env)
    return subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("value, level", [(None, logging.INFO), ("", logging.INFO), ("debug", logging.DEBUG),
                                          ("WARNING", logging.WARNING), (" error ", logging.ERROR), ("15", 15)])
def test_level_from_environment(value, level):
    assert _log.level_from_environment(value) == (level, None)


def test_a_bad_level_is_named_and_info_kept():
    level, complaint = _log.level_from_environment("loud")
    assert level == logging.INFO and "MOEBLAZE_LOG_LEVEL='loud' is not a level" in complaint


def test_the_variable_sets_the_logger_level_at_import():
    code = "import logging, moeblaze; print(logging.getLogger('moeblaze').getEffectiveLevel())"
    assert _python(code, MOEBLAZE_LOG_LEVEL="DEBUG").stdout.split() == ["10"]
    assert _python(code).stdout.split() == ["20"]
    r = _python(code, MOEBLAZE_LOG_LEVEL="loud")
    assert r.stdout.split() == ["20"] and "moeblaze: MOEBLAZE_LOG_LEVEL='loud' is not a level" in r.stderr


def test_records_print_to_stderr_until_the_application_configures_logging():
    code = ("import logging, moeblaze; from moeblaze._log import logger\n"
            "logger.info('one')\n"
            "logging.basicConfig(format='app %(name)s %(message)s')\n"
            "logger.warning('two')\n")
    r = _python(code)
    # Before basicConfig the logger's own handler prints; after it, only the application's.
    assert r.stderr.splitlines() == ["moeblaze: one", "app moeblaze two"], r.stderr
    quiet = _python("import moeblaze; from moeblaze._log import logger; logger.info('one')",
                    MOEBLAZE_LOG_LEVEL="WARNING")
    assert quiet.stderr == ""


def test_progress_counts_are_info_every_few_seconds_and_debug_between(caplog):
    now = [0.0]
    log = _log.ProgressLog(clock=lambda: now[0])
    caplog.set_level(logging.DEBUG, logger="moeblaze")
    log("compiling 108 candidates", False)
    for i in range(1, 30):
        now[0] = i * 1.0
        log(f"compiled {i} of 108 candidates", True)
    log("compiled 108 (cache had 0)", False)
    info = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert info == ["compiling 108 candidates", "compiled 10 of 108 candidates", "compiled 20 of 108 candidates",
                    "compiled 108 (cache had 0)"]
    assert sum(r.levelno == logging.DEBUG for r in caplog.records) == 27


def test_the_library_reports_tune_progress_to_the_logger(tmp_path, broken_toolkit, monkeypatch, caplog):
    """A real mb_tune: the phases come at INFO, a count per compile (from the compile threads)
    at DEBUG or INFO. A broken toolkit makes every compile fail at once, so it is quick."""
    if moeblaze.gpu_available():
        pytest.skip("a GPU is present: the compile-only path is not taken")
    monkeypatch.setenv("CUDA_HOME", str(broken_toolkit))
    caplog.set_level(logging.DEBUG, logger="moeblaze")
    cfg = moeblaze.make_config(8, 2, 64, 64)
    tokens = (ctypes.c_int64 * 1)(64)
    buf = ctypes.create_string_buffer(1 << 16)
    rc = C.lib.mb_tune(ctypes.byref(cfg), tokens, 1, str(tmp_path / "k.db").encode(), 0.0, buf, len(buf))
    assert rc == C.ERR_COMPILE
    n = json.loads(buf.value.decode())["candidates"]
    lines = [r.getMessage() for r in caplog.records if r.name == "moeblaze"]
    assert any(line.startswith(f"compiling {n} candidates of ") for line in lines), lines
    assert f"compiled {n} of {n} candidates" in " ".join(lines), lines
    assert any(line.startswith(f"compiled 0 (cache had 0), {n} failed") for line in lines), lines


class _NoGpuTuner:
    """The C library with mb_tune answering as it does without a GPU."""

    def __init__(self, lib):
        self._lib = lib

    def __getattr__(self, name):
        return getattr(self._lib, name)

    def mb_tune(self, cfg, arr, n, path, budget, buf, size):
        buf.value = json.dumps({"layer": "E=8 K=2 d=64 n=64 swiglu router=softmax", "timed": False,
                                "why_not_timed": "timing needs a GPU (no libcuda)", "db": "/tmp/k.db",
                                "families": []}).encode()
        return C.OK


def test_tune_without_a_gpu_warns_that_nothing_was_timed(monkeypatch, caplog):
    pytest.importorskip("torch")
    import moeblaze.torch as mbt
    monkeypatch.setattr(C, "lib", _NoGpuTuner(C.lib))
    caplog.set_level(logging.INFO, logger="moeblaze")
    m = mbt.MoE(num_experts=8, top_k=2, hidden=64, ffn=64)
    reports = moeblaze.tune(m, tokens=[128])
    assert reports[0]["timed"] is False
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "nothing was timed" in warnings[0] and "timing needs a GPU" in warnings[0]
    assert any("tune: shape 1 of 1" in r.getMessage() for r in caplog.records if r.levelno == logging.INFO)
