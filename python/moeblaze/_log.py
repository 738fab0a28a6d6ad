"""The `moeblaze` logger: progress of work that takes seconds to minutes (compiling a shape's
kernels on its first use, every phase of `moeblaze.tune`) at INFO, per-compile counts at DEBUG
(one INFO count every few seconds), and what a user should act on (nothing was timed) at
WARNING.

The level comes from `MOEBLAZE_LOG_LEVEL` (DEBUG, INFO, WARNING, ERROR, CRITICAL or a number;
default INFO), or from `logging.getLogger("moeblaze").setLevel(...)` at any time. Records
propagate to the application's handlers as usual; while the application has configured none
(no handler on the root logger), the logger prints them to stderr itself, as
"moeblaze: message", so a bare script still sees its progress."""
from __future__ import annotations

import logging
import os
import sys
import time

logger = logging.getLogger("moeblaze")

LEVEL_VARIABLE = "MOEBLAZE_LOG_LEVEL"
DEFAULT_LEVEL = logging.INFO
# A transient progress line (a count) is logged at INFO at most this often, DEBUG otherwise.
COUNT_INTERVAL_S = 10.0


class _StderrUntilConfigured(logging.Handler):
    """Writes to the current sys.stderr while the root logger has no handlers: once the
    application configures logging, the records reach it by propagation alone (never twice)."""

    def emit(self, record: logging.LogRecord) -> None:
        if logging.getLogger().handlers:
            return
        try:
            sys.stderr.write(self.format(record) + "\n")
            sys.stderr.flush()
        except Exception:  # noqa: BLE001 - logging must never break the caller
            self.handleError(record)


def level_from_environment(value: str | None) -> tuple[int, str | None]:
    """The level MOEBLAZE_LOG_LEVEL names, and a complaint when it names none (the default
    level is used then)."""
    if value is None or not value.strip():
        return DEFAULT_LEVEL, None
    v = value.strip()
    if v.lstrip("-").isdigit():
        return int(v), None
    level = logging.getLevelName(v.upper())
    if isinstance(level, int):
        return level, None
    return DEFAULT_LEVEL, (f"{LEVEL_VARIABLE}={value!r} is not a level (DEBUG, INFO, WARNING, ERROR, CRITICAL or a "
                           f"number); using INFO")


def _configure() -> None:
    if any(isinstance(h, _StderrUntilConfigured) for h in logger.handlers):
        return
    handler = _StderrUntilConfigured()
    handler.setFormatter(logging.Formatter("moeblaze: %(message)s"))
    logger.addHandler(handler)
    level, complaint = level_from_environment(os.environ.get(LEVEL_VARIABLE))
    logger.setLevel(level)
    if complaint:
        logger.warning(complaint)


_configure()


class ProgressLog:
    """Turns the library's progress lines into log records: lasting lines (a phase) at INFO,
    transient ones (a count with an estimate) at INFO every COUNT_INTERVAL_S, DEBUG otherwise."""

    def __init__(self, clock=time.monotonic):
        self._clock = clock
        self._last_info = None

    def __call__(self, line: str, transient: bool) -> None:
        now = self._clock()
        if not transient or self._last_info is None or now - self._last_info >= COUNT_INTERVAL_S:
            self._last_info = now
            logger.info(line)
        else:
            logger.debug(line)
