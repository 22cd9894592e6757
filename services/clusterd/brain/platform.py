"""Platform mode: the recovery flow waits on the AI platform's decisions (clusterd.md §7.1, §7.3; the
reference's fault_recover_platform_plugin.go).

A job is in platform mode while its annotations hold ``ProcessRecoverStrategy`` (any value). The
annotations are the PodGroup's in Kubernetes mode and, standalone, kept by ClusterD and read and
written by the platform over HTTP (``GET`` / ``POST /v1/jobs/<id>/platform``, body ``{key: value
| null}``; bearer token when ClusterD has one). Keys, as the reference names them:

======================  ========  ======================================================
key                     written   meaning
======================  ========  ======================================================
ProcessRecoverStrategy  platform  ``retry`` / ``recover`` / ``dump`` ("" = wait for the
                                  platform); ``exit`` too once the faults were confirmed
ProcessConfirmFault     ClusterD  the fault ranks ``rank:type,...`` for the platform to
                                  confirm; the platform clears it (a value still there
                                  when ClusterD writes again fails the flow)
ProcessResultFault      platform  the confirmed ranks ``rank:type,...`` (merged with the
                                  confirmed ones)
RankTableReady          platform  ``true`` before ``changeStrategy recover``; any other
                                  non-empty value fails at once
ProcessRecoverStatus    ClusterD  retry-success / retry-failed / recover-success /
                                  recover-failed / dump-success / dump-failed /
                                  exit-completed (for every job, as the reference does)
======================  ========  ======================================================

Each wait is at most ``platform_s`` (300 s, polled every 3 s or ``poll_s`` when shorter). The
flow: NotifyWaitFaultFlushing waits for the strategy (timeout -> FaultClear / FaultRetry);
NotifyGlobalFault writes ProcessConfirmFault and waits for ProcessResultFault, then re-reads the
strategy (an error -> FaultClear / FaultRetry); retry, recover and dump are chosen only when the
platform says so; before ``changeStrategy recover`` RankTableReady must be ``true``, else the
strategy is re-read and dump (if the platform says dump) or exit is chosen.
"""

from __future__ import annotations

import asyncio
import logging
import time

from clusterd.brain import states
from clusterd.brain.ctlcore import ControllerCore
from faultmesh.log import event

log = logging.getLogger("clusterd.brain")

STRATEGY_KEY = "ProcessRecoverStrategy"
CONFIRM_KEY = "ProcessConfirmFault"
RESULT_KEY = "ProcessResultFault"
RANK_TABLE_KEY = "RankTableReady"
STATUS_KEY = "ProcessRecoverStatus"
KEYS = (STRATEGY_KEY, CONFIRM_KEY, RESULT_KEY, RANK_TABLE_KEY, STATUS_KEY)
STATUS_OF_DECISION = {
    "retry-success": "retry-success",
    "retry-failed": "retry-failed",
    "recover-success": "recover-success",
    "recover-in-place-success": "recover-success",  # in-place reports strategy "recover"
    "recover-failed": "recover-failed",
    "recover-in-place-failed": "recover-failed",
    "dump-success": "dump-success",
    "dump-failed": "dump-failed",
    "exit-completed": "exit-completed",
}
PLATFORM_STRATEGIES = ("retry", "recover", "dump")
POLL_S = 3.0
MAX_VALUE = 64 * 1024
NS = "platform"


def faults_to_string(ranks: list[tuple[str, str]]) -> str:
    """``rank:type,rank:type`` (the reference's Faults2String, duplicates removed, sorted by rank)."""
    seen = dict.fromkeys(ranks)
    return ",".join(f"{r}:{t}" for r, t in sorted(seen, key=lambda x: (int(x[0]), x[1])))


def string_to_faults(text: str) -> list[tuple[str, str]]:
    """Parse ``rank:type,...``; malformed items are skipped. Returns (rank, type) pairs."""
    out = []
    for item in (text or "").split(","):
        rank, _, ftype = item.strip().partition(":")
        if rank.isdigit() and ftype in ("0", "1", "2"):
            out.append((str(int(rank)), ftype))
    return out


class PlatformAnnotations:
    """Standalone store of the platform annotations: job id -> {key: value}, persisted in the
    ClusterD store (namespace ``platform``). A Kubernetes backend with the same ``get`` / ``patch``
    (the PodGroup's annotations) is used instead when given (``backend``: an object with
    ``get(job_id)`` and ``async patch(job_id, changes)``)."""

    def __init__(self, store, spawn, backend=None) -> None:
        self._store = store
        self._spawn = spawn
        self._ann: dict[str, dict[str, str]] = {}
        self.backend = backend

    async def load(self) -> None:
        """Read the persisted annotations (after a restart)."""
        for key, value in (await self._store.kv_items(NS)).items():
            if isinstance(value, dict):
                self._ann[key] = {k: str(v) for k, v in value.items() if k in KEYS}

    def get(self, job_id: str) -> dict[str, str]:
        """The job's platform annotations (a copy)."""
        if self.backend is not None:
            return dict(self.backend.get(job_id))
        return dict(self._ann.get(job_id, {}))

    async def patch(self, job_id: str, changes: dict[str, str | None]) -> bool:
        """Set (None: remove) annotations. Raises ``ValueError`` for an unknown key or a value that
        is not a string of at most 64 KiB. True once written."""
        for k, v in changes.items():
            if k not in KEYS:
                raise ValueError(f"unknown platform key {k!r}; known: {', '.join(KEYS)}")
            if v is not None and (not isinstance(v, str) or len(v) > MAX_VALUE):
                raise ValueError(f"{k} must be a string of at most {MAX_VALUE} characters or null")
        if self.backend is not None:
            return bool(await self.backend.patch(job_id, changes))
        ann = self._ann.setdefault(job_id, {})
        for k, v in changes.items():
            if v is None:
                ann.pop(k, None)
            else:
                ann[k] = v
        await self._store.kv_put(NS, job_id, ann)
        return True

    def on_decision(self, job_id: str, rec: dict) -> None:
        """DecisionLog listener: ProcessRecoverStatus after each check result (never waits)."""
        value = STATUS_OF_DECISION.get(rec.get("decision", ""))
        if value is not None and not rec.get("after_dump"):
            self._spawn(self._write_status(job_id, value), name=f"platform-status-{job_id}")

    async def _write_status(self, job_id: str, value: str) -> None:
        try:
            await self.patch(job_id, {STATUS_KEY: value})
        except Exception as e:  # a failed annotation write is logged, the flow goes on (as the reference)
            event(log, logging.WARNING, "recover status not written", job=job_id, error=repr(e))

    def drop(self, job_id: str) -> None:
        """Forget a deleted job's annotations (standalone)."""
        if self._ann.pop(job_id, None) is not None:
            self._spawn(self._store.kv_delete(NS, job_id), name=f"platform-drop-{job_id}")


class PlatformSteps:
    """The platform-mode steps of the recovery flow (module docstring); ``c`` the controller core.
    A wait that fails ends the flow in FaultClear / FaultRetry."""

    def __init__(self, c: ControllerCore) -> None:
        self.c = c
        self.st = c.st
        self.job_id = c.job_id

    def platform_mode(self) -> bool:
        """True while the job's annotations hold ProcessRecoverStrategy."""
        return STRATEGY_KEY in self.c.ports.platform.get(self.job_id)

    def read_strategy(self, confirmed: bool) -> str | None:
        """The platform's strategy: retry / recover / dump (and exit once ``confirmed``), else None."""
        value = self.c.ports.platform.get(self.job_id).get(STRATEGY_KEY, "").strip().strip(",")
        if value in PLATFORM_STRATEGIES or (confirmed and value == "exit"):
            return value
        return None

    async def _poll(self, what, until: float):
        """Poll ``what()`` until it returns non-None or ``until`` (monotonic) passes."""
        while True:
            v = what()
            if v is not None or time.monotonic() >= until:
                return v
            await asyncio.sleep(min(POLL_S, self.c.t.poll_s, max(0.0, until - time.monotonic())))

    async def wait_platform_strategy(self, flow: str) -> None:
        """WaitPlatFormStrategyReady; a timeout ends in FaultClear / FaultRetry."""
        self.c.set_state(states.WAIT_PLATFORM_STRATEGY)
        s = await self._poll(lambda: self.read_strategy(False), time.monotonic() + self.c.t.platform_s)
        if s is None:
            await self.c.fault_retry(flow, f"platform strategy not set in {self.c.t.platform_s}s")
        self.st.plat_strategy = s
        self.c.decide(flow, "platform-strategy", f"ProcessRecoverStrategy={s}")

    async def confirm_faults(self, flow: str, ranks: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """writeConfirmFaultAndWaitPlatResultFault: ProcessConfirmFault = ``ranks``, wait for
        ProcessResultFault, re-read the strategy. Returns the merged ranks; an error ends in
        FaultClear / FaultRetry."""
        self.c.set_state(states.WAIT_PLATFORM_RESULT_FAULT)
        ann = self.c.ports.platform.get(self.job_id)
        if ann.get(CONFIRM_KEY):
            await self.c.fault_retry(flow, "platform did not clear the previous ProcessConfirmFault")
        await self.c.ports.platform.patch(self.job_id, {CONFIRM_KEY: faults_to_string(ranks)})

        def result():
            a = self.c.ports.platform.get(self.job_id)
            return a.get(RESULT_KEY) if RESULT_KEY in a else None

        text = await self._poll(result, time.monotonic() + self.c.t.platform_s)
        if text is None:
            await self.c.fault_retry(flow, f"ProcessResultFault not set in {self.c.t.platform_s}s")
        confirmed = string_to_faults(self.c.ports.platform.get(self.job_id).get(CONFIRM_KEY, ""))
        merged = list(dict.fromkeys(string_to_faults(text) + confirmed))
        s = self.read_strategy(True)
        if s is None:
            await self.c.fault_retry(
                flow, "platform strategy not retry/recover/dump/exit after the confirmation"
            )
        self.st.plat_strategy = s
        self.c.decide(
            flow,
            "platform-confirmed",
            f"ProcessResultFault={text!r}, ProcessRecoverStrategy={s}",
        )
        return merged

    async def wait_rank_table(self, flow: str) -> bool:
        """WaitRankTableReady: True once RankTableReady is ``true``; another non-empty value or no
        value within ``platform_s`` -> False (the caller re-reads the strategy)."""
        self.c.set_state(states.WAIT_RANK_TABLE_READY)

        def ready():
            v = self.c.ports.platform.get(self.job_id).get(RANK_TABLE_KEY, "")
            return None if v == "" else v

        v = await self._poll(ready, time.monotonic() + self.c.t.platform_s)
        if v == "true":
            return True
        self.c.decide(
            flow, "rank-table-not-ready",
            f"RankTableReady={v!r}" if v is not None else f"RankTableReady not set in {self.c.t.platform_s}s",
        )  # fmt: skip
        return False

    def platform_configured(self, configured: list[str]) -> list[str]:
        """The strategies the platform allows: retry / recover / dump only when it chose that one."""
        if not self.platform_mode():
            return configured
        return [s for s in configured if s not in PLATFORM_STRATEGIES or s == self.st.plat_strategy]
