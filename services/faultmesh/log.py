"""Structured one-line logging: ``ts level logger event key=value ...``.

Every faultmesh service logs through :func:`setup`; events are short stable phrases so operators can
grep (design.md "Stable log phrases"). :class:`RateLimitedLog` logs a repeated reason once per period.

Every daemon (clusterd, noded, deviced, bmc-sim) takes the same three flags from
:func:`add_log_arguments` (``--log-level``, ``--log-file``, ``--log-format``; through
:func:`faultmesh.config.parse` each also reads ``FAULTMESH_LOG_LEVEL`` / ``_FILE`` / ``_FORMAT`` or
the YAML config) and applies them with :func:`setup_from_args`.

Two formats (``setup(fmt=...)``, ``--log-format``, env ``FAULTMESH_LOG_FORMAT``): ``text`` (the
default: ``2026-12-01T09:53:26.566+00:00 INFO clusterd.history fault changed kind=occur ...``) and
``json`` (one object a line: ``{"time": ..., "severity": "INFO", "logger": ..., "event": "fault
changed", "kind": "occur", ...}``; a field named like one of those four is written ``field_<name>``).
Timestamps are RFC 3339 with the local zone's offset, in milliseconds.
"""

from __future__ import annotations

import argparse
import json
import logging
import logging.handlers
import math
import os
import re
import sys
import time
from datetime import datetime
from typing import Any

FORMATS = ("text", "json")
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_QUOTE = re.compile(r'[ ="\n]')  # a value holding one of these is written quoted


def _fmt_value(v: Any) -> str:
    if type(v) is int:
        return str(v)
    s = str(v)
    if s == "" or _QUOTE.search(s):
        s = '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    return s


def kv(**fields: Any) -> str:
    """Render ``key=value`` pairs, quoting values with spaces or quotes."""
    return " ".join(f"{k}={_fmt_value(v)}" for k, v in fields.items())


def event(logger: logging.Logger, level: int, msg: str, /, **fields: Any) -> None:
    """Log one event line: ``msg key=value ...`` (msg first, so stable phrases stay greppable)."""
    if logger.isEnabledFor(level):
        # makeRecord + handle (public Logger API) instead of logger.log: no caller lookup (a stack
        # walk no faultmesh format prints); a burst of fault changes logs a line per change
        text = f"{msg} {kv(**fields)}" if fields else msg
        extra = {"fm_event": msg, "fm_fields": fields}
        logger.handle(
            logger.makeRecord(logger.name, level, "(unknown file)", 0, text, None, None, None, extra)
        )


# the last whole second rendered: (epoch s, "YYYY-MM-DDTHH:MM:SS", "+00:00"), replaced whole (threads log too)
_second: tuple[int, str, str] = (-1, "", "")


def rfc3339(created: float) -> str:
    """``created`` (epoch s) as RFC 3339 in local time with its offset, ms: ``...T09:53:26.566+00:00``
    (the ms truncated, as ``datetime.isoformat(timespec="milliseconds")``; the date, time and offset
    are computed once per second)."""
    global _second
    frac, whole = math.modf(created)  # split as datetime.fromtimestamp does (its rounding too)
    us, sec = round(frac * 1e6), int(whole)
    if us >= 1_000_000:
        sec, us = sec + 1, us - 1_000_000
    cached = _second
    if cached[0] != sec:
        iso = datetime.fromtimestamp(sec).astimezone().isoformat()
        cached = _second = (sec, iso[:19], iso[19:])
    return f"{cached[1]}.{us // 1000:03d}{cached[2]}"


class _Formatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = f"{rfc3339(record.created)} {record.levelname} {record.name} {record.getMessage()}"
        if record.exc_info:
            line += " exc=" + _fmt_value(self.formatException(record.exc_info).replace("\n", " | "))
        return line


_CORE = ("time", "severity", "logger", "event")


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ev = getattr(record, "fm_event", None)
        d: dict[str, Any] = {
            "time": rfc3339(record.created),
            "severity": record.levelname,
            "logger": record.name,
            "event": record.getMessage() if ev is None else ev,
        }
        for k, v in (getattr(record, "fm_fields", None) or {}).items():
            d[f"field_{k}" if k in _CORE else k] = v if isinstance(v, int | float | bool | None) else str(v)
        if record.exc_info:
            d["exc"] = self.formatException(record.exc_info)
        return json.dumps(d, ensure_ascii=False)


def setup(
    level: str = "INFO",
    log_file: str | None = None,
    max_bytes: int = 20 << 20,
    backups: int = 5,
    fmt: str | None = None,
) -> None:
    """Configure the root logger: stderr, plus a rotating ``log_file`` (max_bytes, backups) when given.
    ``fmt``: ``text`` or ``json`` (None: env ``FAULTMESH_LOG_FORMAT``, else text). Raises ``ValueError``
    for another format."""
    fmt_name = fmt or os.environ.get("FAULTMESH_LOG_FORMAT") or "text"
    if fmt_name not in FORMATS:
        raise ValueError(f"log format {fmt_name!r}: use one of {', '.join(FORMATS)}")
    # no thread / process names on the records: no faultmesh format prints them (logging HOWTO,
    # "Optimization")
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    if str(level).upper() not in LEVELS:
        raise ValueError(f"log level {level!r}: use one of {', '.join(LEVELS)}")
    root = logging.getLogger()
    root.handlers.clear()
    root.setLevel(level.upper())
    fmt_obj = _JsonFormatter() if fmt_name == "json" else _Formatter()
    h: logging.Handler = logging.StreamHandler(sys.stderr)
    h.setFormatter(fmt_obj)
    root.addHandler(h)
    if log_file:
        fh = logging.handlers.RotatingFileHandler(log_file, maxBytes=max_bytes, backupCount=backups)
        fh.setFormatter(fmt_obj)
        root.addHandler(fh)
    logging.getLogger("grpc").setLevel(logging.WARNING)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


def log_level_arg(text: str) -> str:
    """argparse ``type=`` check of a log level (any case) -> its upper-case name (:data:`LEVELS`):
    for commands that pass it on to the processes they start (``faultmesh up``, the demo)."""
    if str(text).upper() not in LEVELS:
        raise argparse.ArgumentTypeError(f"{text!r}: use one of {', '.join(LEVELS)}")
    return str(text).upper()


def add_log_arguments(parser, file_help: str = "also log to this file (rotated at 20 MiB, 5 kept)") -> None:
    """Add ``--log-level`` (default INFO), ``--log-file`` and ``--log-format text|json`` (default
    None: env ``FAULTMESH_LOG_FORMAT``, else text) to ``parser``: the one spelling of the log flags
    on every daemon."""
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ERROR (default INFO)")
    parser.add_argument("--log-file", help=file_help)
    parser.add_argument(
        "--log-format",
        choices=FORMATS,
        default=None,
        help="log lines: text (ts level logger event key=value) or json (one object a line); "
        "default: env FAULTMESH_LOG_FORMAT, else text",
    )


def setup_from_args(args) -> None:
    """:func:`setup` from the flags of :func:`add_log_arguments` (``args.log_file`` None: no file).
    A log file that cannot be opened exits 2 with one line on stderr (a daemon's configuration
    error), not a traceback."""
    try:
        setup(args.log_level, args.log_file, fmt=args.log_format)
    except OSError as e:
        sys.stderr.write(f"error: --log-file {args.log_file}: {e.strerror or e}\n")
        raise SystemExit(2) from None
    except ValueError:  # an unknown level (the flag, FAULTMESH_LOG_LEVEL or the YAML config)
        sys.stderr.write(f"error: --log-level {args.log_level!r}: use one of {', '.join(LEVELS)}\n")
        raise SystemExit(2) from None


class RateLimitedLog:
    """Log a message at most once per ``period_s`` per reason key (a counter stays exact elsewhere)."""

    def __init__(self, logger: logging.Logger, period_s: float = 60.0, clock=time.monotonic) -> None:
        self._logger = logger
        self._period_s = period_s
        self._clock = clock
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def warning(self, reason: str, msg: str, **fields: Any) -> bool:
        """Log ``msg`` at WARNING unless ``reason`` was logged in the last period (see :meth:`log`)."""
        return self.log(logging.WARNING, reason, msg, **fields)

    def log(self, level: int, reason: str, msg: str, **fields: Any) -> bool:
        """Log ``msg`` at ``level`` unless ``reason`` was logged in the last period; the line carries
        ``suppressed=<lines left out since>``. Returns True when logged."""
        now = self._clock()
        last = self._last.get(reason)
        if last is not None and now - last < self._period_s:
            self._suppressed[reason] = self._suppressed.get(reason, 0) + 1
            return False
        self._last[reason] = now
        suppressed = self._suppressed.pop(reason, 0)
        event(self._logger, level, msg, reason=reason, suppressed=suppressed, **fields)
        return True
