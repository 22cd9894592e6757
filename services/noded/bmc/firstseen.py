"""``--bmc-state-file``: the first-seen times of the BMC faults active at the last write (issue 30).

A noded restart is invisible: after it, a BMC fault that the first successful poll still shows is the
same occurrence and keeps the first-seen time it had before (noded's own view, its agent state and
what it sends clusterd); the kept times of faults that poll no longer shows are forgotten (they
recovered while noded was down: clusterd records that one recover when the poll's snapshot arrives).
The file is rewritten (atomically, when its content changed) after each successful poll. A corrupt
file is rejected by :class:`faultmesh.statefile.JsonStateFile`: noded starts with no kept times.

Shape: ``{"version": 1, "faults": {"<source>|<device_type>|<device_id>|<code>": first_seen_ms}}``.
"""

from __future__ import annotations

from collections.abc import Iterable

from faultmesh.model import Fault
from faultmesh.statefile import JsonStateFile

VERSION = 1


def fault_id(f: Fault) -> str:
    """The state file's key of a fault: ``source|device_type|device_id|code``."""
    return f"{f.source}|{f.device_type}|{f.device_id}|{f.code}"


class FirstSeen:
    """The kept first-seen times (epoch ms) of ``file`` (its path None: off)."""

    def __init__(self, file: JsonStateFile) -> None:
        self.file = file
        self.kept: dict[str, int] = {}

    def load(self) -> int:
        """Read the file (once, at start). Returns the number of kept times."""
        doc = self.file.load()
        faults = doc.get("faults", {})
        if not isinstance(faults, dict):
            self.file.reject("bad-shape", "faults is not a JSON object")
            faults = {}
        self.kept = {k: v for k, v in faults.items() if isinstance(v, int) and v > 0}
        return len(self.kept)

    def apply(self, faults: list[Fault]) -> list[Fault]:
        """``faults`` with their kept first-seen times (until the first successful poll is settled)."""
        if not self.kept:
            return faults
        out = []
        for f in faults:
            t = self.kept.get(fault_id(f))
            out.append(f.with_times(t, f.last_seen_ms) if t is not None and t < f.first_seen_ms else f)
        return out

    def polled(self, active: Iterable[Fault]) -> None:
        """A successful poll was published with the ``active`` BMC faults: their times are in the
        agent state now, so the kept ones are done with; write the file when it changed."""
        self.kept = {}
        self.file.save({"version": VERSION, "faults": {fault_id(f): f.first_seen_ms for f in active}})
