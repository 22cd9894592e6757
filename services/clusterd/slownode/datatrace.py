"""Slow-node detection: the data-trace switch, the one hook FD-OL uses to turn communication
profiling on and off (reference fdol.md §1.1; see :mod:`clusterd.slownode`)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from clusterd.brain.datatrace import switch_message, write_switch
from clusterd.slownode.jobs import AGENT
from fdol.slownode.switch import SWITCH_FILE, switch_dir_name

if TYPE_CHECKING:
    from clusterd.brain.jobs import JobRegistry

SetSwitch = Callable[[str, dict[str, str]], Awaitable[None]]  # (ns/name, switch) -> done
Send = Callable[..., Awaitable[bool]]  # the agent stream's send(node, agent, **control)


class DataTraceSwitch:
    """Sets a job's data-trace switch. ``root``: the folder of the switch files written here;
    ``send``: the agent stream's ``send``; ``jobs``: the brain's job registry and ``brain_switch``:
    the brain's TrainingDataTrace hook (both None without a brain)."""

    def __init__(
        self, root: str, send: Send, jobs: JobRegistry | None = None, brain_switch: SetSwitch | None = None
    ) -> None:
        self.root = root
        self._send = send
        self._jobs = jobs
        self._brain_switch = brain_switch

    async def set(
        self, job_ns_name: str, switch_dict: dict[str, str], nodes: list[str] | None = None
    ) -> None:
        """Set the switch of job ``<ns>/<name>``.

        When the brain (issue 7) knows the job, its TrainingDataTrace service does it (file, state,
        subscribers, ``data_trace`` control to the job's nodes). Otherwise this writes
        ``<root>/<ns>.data-trace-<job>/profilingSwitch`` itself and sends a ``data_trace`` control
        message to ``nodes``. Raises ``OSError`` when the file cannot be written.
        """
        ns, _, name = job_ns_name.partition("/")
        reg = self._jobs
        if self._brain_switch is not None and reg is not None and reg.by_ns_name(ns, name) is not None:
            await self._brain_switch(job_ns_name, switch_dict)
            return
        path = Path(self.root) / switch_dir_name(ns, name) / SWITCH_FILE
        await asyncio.to_thread(write_switch, path, orjson.dumps(switch_dict))
        msg = switch_message(job_ns_name, switch_dict)
        for node in nodes or []:
            await self._send(node, AGENT, data_trace=msg)
