"""The reference's custom processor (clusterd.md §6.2 "custom"; reference
``faultmanager/cmprocess/custom``): a job's fault filter annotations keep young faults on its
devices out of the job's fault view, so the brain does not start a recovery for a fault the
workload rides out by itself.

- Which faults: chip faults on the job's NPUs (every rank fault of an NPU fault is on a job device by
  construction) and UnifiedBus switch faults (source ``lingqu``) on its nodes; never NodeD node
  faults or public faults of other kinds.
- How long: the code's window of ``huawei.com/schedule.filter.faultCode`` if the code is listed,
  else the level's window of ``huawei.com/schedule.filter.faultLevel`` (:mod:`faultmesh.faultfilter`);
  hidden while the fault has lasted at most its window since its first-seen time.
- MindIE: a MindIE server job (``app: mindie-ms-server``) without a level annotation hides every
  ``RestartRequest`` fault for 60 s while the service's controller is subscribed to the Fault service
  (jobId the service id, role ``mindie-ms-controller``; the reference's ``selfrecoverFaultTimeout``
  and ``IsSubscribed(MultiInstanceJobId, ControllerAppType)``): the controller handles the fault
  itself.

Differences: the window runs from the fault's first-seen time (the agent's), where the reference
counts from the first time ClusterD received the code (not kept across a ClusterD restart, so there
a restart hides every young fault again).
"""

from __future__ import annotations

from functools import lru_cache

from clusterd.brain.mindie import SERVER
from faultmesh.faultfilter import parse_filter
from faultmesh.jobspec import Job
from faultmesh.model import Fault

SWITCH_SOURCE = "lingqu"
MINDIE_LEVELS = {"RestartRequest": 60}  # a MindIE server job's default while its controller subscribes


@lru_cache(maxsize=1024)
def _windows(text: str, kind: str) -> dict[str, int]:
    return parse_filter(text, kind)[0]


def needs_subscription(job: Job) -> bool:
    """True when ``job``'s filter depends on its MindIE controller's Fault-service subscription."""
    return job.app == SERVER and not job.filter_fault_level


def windows(job: Job, subscribed: bool = False) -> tuple[dict[str, int], dict[str, int]] | None:
    """(code -> window s, level -> window s) of ``job``'s filter, or None when it has none (most
    jobs). ``subscribed``: the job's MindIE controller is subscribed to the Fault service."""
    levels = _windows(job.filter_fault_level, "level") if job.filter_fault_level else {}
    if needs_subscription(job) and subscribed:
        levels = MINDIE_LEVELS
    codes = _windows(job.filter_fault_code, "code") if job.filter_fault_code else {}
    return (codes, levels) if codes or levels else None


def hidden_until(f: Fault, filt: tuple[dict[str, int], dict[str, int]], now_ms: int) -> int | None:
    """The time (ms) until which fault ``f`` is hidden by the job filter ``filt`` (:func:`windows`),
    or None when it is not hidden now."""
    if f.source != SWITCH_SOURCE and not (f.device_type == "NPU" and f.device_id >= 0):
        return None
    codes, levels = filt
    window = codes.get(f.code)
    if window is None:
        window = levels.get(f.level)
    if window is None:
        return None
    until = f.first_seen_ms + window * 1000
    return until if now_ms <= until else None
