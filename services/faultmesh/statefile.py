"""An agent's JSON state file (deviced ``--state-file``, noded ``--bmc-state-file``): read once at
start, rewritten atomically when its content changed.

Bad input (issue 30): a file that cannot be read, is not JSON (corrupt, truncated) or is not a JSON
object is *rejected*: the agent starts with empty state, one log line says so
(``state file rejected, starting with empty state``), ``rejected[reason]`` counts it (the agents export
it as ``faultmesh_<agent>_state_file_rejected_total{reason}``) and the file is kept beside as
``<path>.corrupt`` for a look, so the next write does not destroy the evidence. A rejected file is
never a reason for an escalation: the rules simply start from nothing, as on a first start.
"""

from __future__ import annotations

import collections
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path

from faultmesh.files import atomic_write
from faultmesh.log import event

__all__ = ["JsonStateFile"]


class JsonStateFile:
    """The state file at ``path`` (None: off), logging on ``log``; ``on_reject(reason)`` is called for
    each rejected file (an agent's metric).

    ``rejected`` counts rejected files by reason (``unreadable``, ``corrupt``, ``not-an-object``, or
    the caller's own through :meth:`reject`); ``write_failures`` counts failed writes. Nothing here
    raises: failures are logged and counted.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None,
        log: logging.Logger,
        on_reject: Callable[[str], None] | None = None,
    ) -> None:
        self.path = Path(path) if path else None
        self.log = log
        self.on_reject = on_reject
        self.rejected: collections.Counter[str] = collections.Counter()
        self.write_failures = 0
        self._saved = ""

    def load(self) -> dict:
        """The document (a dict); ``{}`` when off, missing or rejected (see module docstring)."""
        if self.path is None:
            return {}
        try:
            text = self.path.read_bytes().decode("utf-8")
        except FileNotFoundError:
            return {}
        except (OSError, UnicodeDecodeError) as e:
            self.reject("unreadable", str(e))
            return {}
        try:
            data = json.loads(text)
        except ValueError as e:
            self.reject("corrupt", str(e))
            return {}
        if not isinstance(data, dict):
            self.reject("not-an-object", f"a JSON {type(data).__name__}, not an object")
            return {}
        self._saved = json.dumps(data, sort_keys=True)
        return data

    def reject(self, reason: str, error: str) -> None:
        """Reject the file read (count ``reason``, one log line, keep it as ``<path>.corrupt``)."""
        assert self.path is not None
        self.rejected[reason] += 1
        if self.on_reject is not None:
            self.on_reject(reason)
        kept = self.path.with_name(self.path.name + ".corrupt")
        try:
            os.replace(self.path, kept)
        except OSError:
            kept = None
        self._saved = ""
        event(
            self.log,
            logging.ERROR,
            "state file rejected, starting with empty state",
            path=str(self.path),
            reason=reason,
            error=error[:200],
            kept_as=str(kept) if kept else "",
        )

    def save(self, doc: dict) -> bool:
        """Write ``doc`` when it differs from the last write (or read). Returns True when written."""
        if self.path is None:
            return False
        body = json.dumps(doc, sort_keys=True)
        if body == self._saved:
            return False
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(self.path, body.encode())
        except OSError as e:
            self.write_failures += 1
            event(self.log, logging.ERROR, "state file write failed", path=str(self.path), error=str(e))
            return False
        self._saved = body
        return True
