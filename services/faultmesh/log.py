"""Structured one-line logging: ``ts level logger event key=value ...``.

Every faultmesh service logs through :func:`setup`; events are short stable phrases so operators can
grep (design.md "Stable log phrases"). :class:`RateLimitedLog` logs a repeated reason once per period.
"""

from __future__ import annotations

import logging
import logging.handlers
import sys
import time
from typing import Any


def _fmt_value(v: Any) -> str:
    s = str(v)
    if s == "" or any(c in s for c in ' ="\n'):
        s = '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    return s


def kv(**fields: Any) -> str:
    """Render ``key=value`` pairs, quoting values with spaces or quotes."""
    return " ".join(f"{k}={_fmt_value(v)}" for k, v in fields.items())


def event(logger: logging.Logger, level: int, msg: str, /, **fields: Any) -> None:
    """Log one event line: ``msg key=value ...`` (msg first, so stable phrases stay greppable)."""
    if logger.isEnabledFor(level):
        logger.log(level, f"{msg} {kv(**fields)}" if fields else msg)


class _Formatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        t = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(record.created))
        line = f"{t}.{int(record.msecs):03d} {record.levelname} {record.name} {record.getMessage()}"
        if record.exc_info:
            line += " exc=" + _fmt_value(self.formatException(record.exc_info).replace("\n", " | "))
        return line


def setup(
    level: str = "INFO", log_file: str | None = None, max_bytes: int = 20 << 20, backups: int = 5
) -> None:
    """Configure the root logger: stderr, plus a rotating ``log_file`` (max_bytes, backups) when given."""
    root = logging.getLogger()
    root.handlers.clear()
    root.setLevel(level.upper())
    fmt = _Formatter()
    h: logging.Handler = logging.StreamHandler(sys.stderr)
    h.setFormatter(fmt)
    root.addHandler(h)
    if log_file:
        fh = logging.handlers.RotatingFileHandler(log_file, maxBytes=max_bytes, backupCount=backups)
        fh.setFormatter(fmt)
        root.addHandler(fh)
    logging.getLogger("grpc").setLevel(logging.WARNING)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


class RateLimitedLog:
    """Log a message at most once per ``period_s`` per reason key (a counter stays exact elsewhere)."""

    def __init__(self, logger: logging.Logger, period_s: float = 60.0, clock=time.monotonic) -> None:
        self._logger = logger
        self._period_s = period_s
        self._clock = clock
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def warning(self, reason: str, msg: str, **fields: Any) -> bool:
        """Log ``msg`` unless ``reason`` was logged in the last period. Returns True when logged."""
        now = self._clock()
        last = self._last.get(reason)
        if last is not None and now - last < self._period_s:
            self._suppressed[reason] = self._suppressed.get(reason, 0) + 1
            return False
        self._last[reason] = now
        suppressed = self._suppressed.pop(reason, 0)
        event(self._logger, logging.WARNING, msg, reason=reason, suppressed=suppressed, **fields)
        return True
