"""The data-trace profiling switch (reference fdol.md §1.1).

File content (JSON, values "on"/"off")::

    {"CommunicationOperator": "off", "Step": "on", "SaveCheckpoint": "on", "FP": "on", "DataLoader": "on"}

The producer maps it to two domains: *default* (step, forward, dataloader, save_checkpoint markers) on
when any of the five is on; *communication* on when CommunicationOperator is on. An unreadable or
invalid file means everything off. FD-OL uses: all on ("heavy"/"all profiling"), communication off
with the rest on ("stop heavy"), all off ("stop all"). Host path of a job's switch (device-plugin
layout): ``<datatrace root>/<namespace>.data-trace-<job name>/profilingSwitch``.
"""

from __future__ import annotations

from fdol import strictjson

SWITCH_KEYS = ("CommunicationOperator", "Step", "SaveCheckpoint", "FP", "DataLoader")
SWITCH_FILE = "profilingSwitch"


def switch_dict(default_on: bool, comm_on: bool) -> dict[str, str]:
    """The five-key switch for a (default domain, communication domain) state."""
    d = {k: ("on" if default_on else "off") for k in SWITCH_KEYS}
    d["CommunicationOperator"] = "on" if comm_on else "off"
    return d


HEAVY = switch_dict(True, True)
LIGHT = switch_dict(True, False)
ALL_OFF = switch_dict(False, False)


def parse_switch(data: bytes | str) -> tuple[bool, bool]:
    """-> (default domain on, communication domain on). Invalid input -> (False, False)."""
    try:
        obj = strictjson.loads(data)
    except ValueError:
        return False, False
    if not isinstance(obj, dict):
        return False, False
    vals = {k: obj.get(k) for k in SWITCH_KEYS}
    if not all(v in ("on", "off") for v in vals.values()):
        return False, False
    comm = vals["CommunicationOperator"] == "on"
    return any(v == "on" for v in vals.values()), comm


def switch_dir_name(namespace: str, job_name: str) -> str:
    """``<ns>.data-trace-<job>`` (the device-plugin host directory name)."""
    return f"{namespace}.data-trace-{job_name}"
