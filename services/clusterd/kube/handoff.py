"""Kubernetes mode, the rescheduling hand-off (issue 15; reference clusterd.md §7.3, §6.5, §1 "Recover").

The brain's recovery decisions (:class:`clusterd.brain.decisions.DecisionLog` listeners: job id and
the decision record) become the writes the reference's ClusterD makes for Volcano and the Ascend
Operator:

- ``reset-config-<job>`` (job namespace; users create it, it is updated, never created -- an absent
  one is counted as ``faultmesh_kube_writes_total{kind="reset_config",result="absent"}``): key
  ``reset.json`` = ``{RankList: [{RankId, LogicId, PhyId, Status: "fault", Policy, InitialPolicy,
  ErrorCode, ErrorCodeHex, FaultLevel}], UpdateTime, RetryTime, FaultFlushing, GracefulExit,
  RestartFaultProcess}`` and ``checkCode`` (sha256 of reset.json, as deviced writes its files):

  * a fault decision (``stop-train``, ``dump``, ``pre-exit``) writes the fault list -- every rank of
    each fault pod -- with ``FaultFlushing=true``;
  * ``exit-completed`` (NotifyRestartAllProcess) writes ``RetryTime+1`` and ``RestartFaultProcess=true``,
    then FaultRetry: PodGroup label ``process-recover-enable=pause`` until the PodGroup is
    ``Running`` again (at most ``wait-reschedule-timeout`` s), then ``on``, and the reset CM is
    cleared;
  * ``in-place-split`` (recover-in-place) sets ``RestartFaultProcess`` when some fault pod restarts
    its processes in place, and rewrites the fault list: a pod that restarts in place lists only
    its own fault ranks, a pod that restarts as a pod every rank;
  * a success (``*-success``), ``fault-clear``, ``kill-job`` or ``reset`` clears it (RankList
    empty, flags false, RetryTime kept) and removes the fault pods' labels.
- fault-pod labels: ``fault-type=software`` on the pods of ranks the training side reported, or
  ``retry-fault`` when every cached fault is a retry type (0 / 2): at each ReportProcessFault, as the
  reference's does (:meth:`HandOff.on_report`, a retry report included, which decides nothing by
  itself), and at a fault decision on reported ranks; a pod already carrying the value is not patched.

A fault list that would isolate a node (Policy ``isolate``: PreSeparateNPU, SeparateNPU,
ManuallySeparateNPU) first asks the isolation circuit breaker (:mod:`clusterd.breaker`, path
``reset-config``, issue 30): the faults of a node it holds are left out of the RankList (the reset
CM keeps what it said about that node; ``reset config isolation held`` is logged) and the decision is
handled again when an operator releases the breaker.

Writes run in one task, in decision order; each is retried (:func:`faultmesh.retry.retrying`) and
then dropped with a logged, counted reason. The hot switch's backup-pod annotations for the
Operator are the controller's pod port (:mod:`.podport`); ``fault-job-info`` is
:mod:`.faultjobinfo`.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import json
import logging
import time
from collections.abc import Callable

from clusterd.brain.jobs import JobRegistry
from clusterd.brain.platform import KEYS as PLATFORM_KEYS
from clusterd.breaker import IsolationBreaker
from clusterd.kube import podgroups as pgs
from clusterd.kube.metrics import KubeMetrics
from faultmesh.kube import KubeApi, KubeError
from faultmesh.log import event
from faultmesh.retry import retrying

log = logging.getLogger("clusterd.kube")

FAULT_DECISIONS = frozenset({"stop-train", "dump", "pre-exit"})
CLEAR_DECISIONS = frozenset({"fault-clear", "kill-job", "reset"})
RESTART_DECISIONS = frozenset({"exit-completed"})
IN_PLACE_DECISION = "in-place-split"
REPORT = "report-process-fault"  # not a decision: a queued ReportProcessFault (on_report)
FAULT_TYPE_LABEL = "fault-type"
PROCESS_RECOVER_LABEL = "process-recover-enable"
QUEUE_MAX = 10_000
POLICY = {
    "RestartRequest": "restart_request",
    "RestartBusiness": "restart",
    "FreeRestartNPU": "free_reset",
    "RestartNPU": "reset",
    "PreSeparateNPU": "isolate",
    "SeparateNPU": "isolate",
    "ManuallySeparateNPU": "isolate",
}


def reset_doc(old: dict | None, **changes) -> dict:
    """A reset.json document: ``old``'s fields (defaults when None) with ``changes``."""
    doc = {
        "RankList": [],
        "UpdateTime": 0,
        "RetryTime": 0,
        "FaultFlushing": False,
        "GracefulExit": 0,
        "RestartFaultProcess": False,
    }
    if isinstance(old, dict):
        doc.update({k: old[k] for k in doc if k in old})
    doc.update(changes)
    doc["UpdateTime"] = int(time.time())
    return doc


def rank_list(job, faults: list[dict], in_place_pods: frozenset[int] = frozenset()) -> list[dict]:
    """The reset CM's RankList, Status ``fault``: every rank of each fault pod (node), except that
    a pod in ``in_place_pods`` (pod ranks that restart only their processes) lists only its own
    fault ranks (clusterd.md §7.3 step 3; the reference's normalFaultAssociateSameNodeRank with
    recoverInPlaceFaultAssociateSameNodeRank)."""
    by_node: dict[str, dict] = {}
    for f in faults:
        by_node.setdefault(f["node"], f)
    faulty = {f["rank"] for f in faults}
    out = []
    for node, f in sorted(by_node.items()):
        ranks = job.ranks_on(node) if job is not None else []
        if f.get("pod_rank", -1) in in_place_pods:
            ranks = [r for r in ranks if r.rank in faulty]
        for r in ranks or []:
            pol = POLICY.get(f.get("level", ""), "restart")
            own = next((x for x in faults if x["rank"] == r.rank), f)
            out.append(
                {
                    "RankId": r.rank,
                    "LogicId": -1,
                    "PhyId": r.device_id,
                    "Status": "fault",
                    "Policy": pol,
                    "InitialPolicy": pol,
                    "ErrorCode": [],
                    "ErrorCodeHex": own.get("code", "") if own["rank"] == r.rank else "",
                    "FaultLevel": own.get("level", "") if own["rank"] == r.rank else "",
                }
            )
    return sorted(out, key=lambda x: x["RankId"])


class HandOff:
    """See the module docstring. ``pods_of(job_id)``: the job's pod objects; ``api`` is set at start;
    ``breaker``: asked before a RankList isolates a node (None: every isolation written)."""

    def __init__(
        self,
        jobs: JobRegistry,
        podgroups: pgs.PodGroups,
        pods_of: Callable[[str], list[dict]],
        metrics: KubeMetrics,
        spawn: Callable[..., asyncio.Task],
        attempts: int = 5,
        breaker: IsolationBreaker | None = None,
    ) -> None:
        self.jobs = jobs
        self.breaker = breaker
        self._held: dict[str, dict] = {}  # job id -> its last fault decision with a node held back
        self.podgroups = podgroups
        self.pods_of = pods_of
        self.metrics = metrics
        self.spawn = spawn
        self.attempts = attempts
        self.api: KubeApi | None = None
        self._queue: collections.deque[tuple[str, dict]] = collections.deque(maxlen=QUEUE_MAX)
        self._due = asyncio.Event()
        self._labelled: dict[str, dict[tuple[str, str], str]] = {}  # job -> pod we labelled -> value

    def on_decision(self, job_id: str, rec: dict) -> None:
        """The decision-log listener: queue the decision (never waits)."""
        d = rec.get("decision", "")
        if (
            d in FAULT_DECISIONS or d in CLEAR_DECISIONS or d in RESTART_DECISIONS or d == IN_PLACE_DECISION
            or d.endswith("-success") or d == REPORT
        ):  # fmt: skip
            if len(self._queue) == self._queue.maxlen:
                self.metrics.writes.labels("handoff", "dropped").inc()
            self._queue.append((job_id, rec))
            self._due.set()

    def on_report(self, job_id: str, faults: list, reason: str) -> None:
        """The brain's ReportProcessFault listener (reported rank faults, ``retry-fault`` or
        ``software``): queue the fault-pod labels (never waits)."""
        self.on_decision(
            job_id, {"decision": REPORT, "faults": [f.as_dict() for f in faults], "reason": reason}
        )

    def admitted(self, job_id: str, rec: dict, faults: list[dict]) -> list[dict]:
        """``faults`` less those of the nodes whose isolation the breaker holds (module docstring)."""
        if self.breaker is None or not self.breaker.enabled:
            return faults
        isolating = sorted({f["node"] for f in faults if POLICY.get(f.get("level", "")) == "isolate"})
        held = {n for n in isolating if not self.breaker.admit(n, "reset-config")}
        if not held:
            self._held.pop(job_id, None)
            return faults
        self._held[job_id] = rec
        event(log, logging.WARNING, "reset config isolation held", job=job_id, nodes=",".join(sorted(held)))
        return [f for f in faults if f["node"] not in held]

    def on_breaker_release(self, nodes: list[str]) -> None:
        """The isolation breaker was released: handle again the decisions it held back on ``nodes``."""
        released = set(nodes)
        for job_id, rec in list(self._held.items()):
            if any(f.get("node") in released for f in rec.get("faults") or ()):
                del self._held[job_id]
                self._queue.append((job_id, rec))
                self._due.set()

    # -- the writes ------------------------------------------------------------------------------
    async def _call(self, what: str, fn) -> bool:
        try:
            await retrying(fn, on=(KubeError,), attempts=self.attempts, initial_s=0.2, max_s=5.0)
        except KubeError as e:
            self.metrics.writes.labels(what, "error").inc()
            self.metrics.api_errors.labels(e.op, str(e.status)).inc()
            event(log, logging.WARNING, "kube hand-off write failed", kind=what, error=str(e))
            return False
        self.metrics.writes.labels(what, "ok").inc()
        return True

    async def write_reset(self, job, **changes) -> bool:
        """Update the job's reset-config CM (read, change, write). False when absent or failed."""
        assert self.api is not None
        api = self.api
        name = f"reset-config-{job.name}"

        async def once() -> None:
            try:
                cm = await api.get_config_map(job.namespace, name)
            except KubeError as e:
                if e.status == 404:
                    raise LookupError from None
                raise
            try:
                old = json.loads((cm.get("data") or {}).get("reset.json") or "{}")
            except ValueError:
                old = None  # a corrupt document is simply overwritten
            text = json.dumps(reset_doc(old, **changes), sort_keys=True)
            data = {"reset.json": text, "checkCode": hashlib.sha256(text.encode()).hexdigest()}
            await api.patch_config_map(job.namespace, name, {"data": data})

        try:
            ok = await self._call("reset_config", once)
        except LookupError:
            self.metrics.writes.labels("reset_config", "absent").inc()
            return False
        if ok:
            event(
                log,
                logging.INFO,
                "reset config updated",
                job=job.ns_name,
                **{k: str(v) for k, v in changes.items() if k != "RankList"},
            )
        return ok

    async def label_podgroup(self, job_id: str, value: str | None) -> bool:
        """Set (None: remove) the PodGroup's ``process-recover-enable`` label."""
        assert self.api is not None
        pg = self.podgroups.get(job_id)
        if pg is None:
            return False
        meta = pg["metadata"]
        body = {"metadata": {"labels": {PROCESS_RECOVER_LABEL: value}}}
        ok = await self._call(
            "podgroup",
            lambda: self.api.patch_custom(
                pgs.GROUP, pgs.VERSION, meta["namespace"], pgs.PLURAL, meta["name"], body
            ),
        )
        if ok:
            event(
                log,
                logging.INFO,
                "podgroup labelled",
                podgroup=f"{meta['namespace']}/{meta['name']}",
                value=value or "",
            )
        return ok

    async def label_pods(self, job, faults: list[dict], value: str | None = None) -> None:
        """``fault-type`` = ``value`` on the pods of the ranks the training side reported (code "");
        without ``value``: ``retry-fault`` when every reported rank is a retry type, else ``software``.
        A pod that already has the value from us is not patched again."""
        assert self.api is not None
        reported = [f for f in faults if not f.get("code")]
        if not reported:
            return
        if value is None:
            value = "retry-fault" if all(f.get("fault_type") in ("0", "2") for f in reported) else "software"
        nodes = {f["node"] for f in reported}
        labelled = self._labelled.setdefault(job.id, {})
        for pod in self.pods_of(job.id):
            meta = pod.get("metadata") or {}
            key = (meta.get("namespace", ""), meta.get("name", ""))
            if (pod.get("spec") or {}).get("nodeName") not in nodes or labelled.get(key) == value:
                continue
            body = {"metadata": {"labels": {FAULT_TYPE_LABEL: value}}}
            if await self._call("pod_label", lambda k=key, b=body: self.api.patch_pod(k[0], k[1], b)):
                labelled[key] = value

    async def unlabel_pods(self, job_id: str) -> None:
        assert self.api is not None
        body = {"metadata": {"labels": {FAULT_TYPE_LABEL: None}}}
        for key in sorted(self._labelled.pop(job_id, {})):
            await self._call("pod_label", lambda k=key: self.api.patch_pod(k[0], k[1], body))

    async def fault_retry(self, job) -> None:
        """FaultRetry: label pause, wait for the PodGroup to run again, label on, clear the reset CM."""
        if not await self.label_podgroup(job.id, "pause"):
            return
        _, extra = self.podgroups.settings(job.id)
        wait_s = int(extra.get(pgs.WAIT_RESCHEDULE, pgs.WAIT_RESCHEDULE_DEFAULT_S))
        if not await self.podgroups.wait_phase(job.id, "Running", wait_s):
            event(log, logging.WARNING, "job not running again after rescheduling", job=job.ns_name)
        await self.label_podgroup(job.id, "on")
        await self.write_reset(job, RankList=[], FaultFlushing=False, RestartFaultProcess=False)

    async def handle(self, job_id: str, rec: dict) -> None:
        """The writes of one decision."""
        job = self.jobs.get(job_id)
        if job is None:
            return
        d = rec.get("decision", "")
        faults = list(rec.get("faults") or [])
        if d == REPORT:
            await self.label_pods(job, faults, rec.get("reason"))
        elif d in FAULT_DECISIONS and faults:
            faults = self.admitted(job_id, rec, faults)
            if faults:  # else every node is held: nothing new to write
                await self.write_reset(job, RankList=rank_list(job, faults), FaultFlushing=True)
                await self.label_pods(job, faults)
        elif d == IN_PLACE_DECISION:  # WriteResetInfoToCM(allFaultRanks, restartFaultProcess, ...)
            in_place = frozenset(rec.get("restart_process_pods") or ())
            changes: dict = {"RestartFaultProcess": bool(in_place)}
            faults = self.admitted(job_id, rec, faults) if faults else faults
            if faults:
                changes["RankList"] = rank_list(job, faults, in_place)
            await self.write_reset(job, **changes)
        elif d in RESTART_DECISIONS:
            api = self.api
            assert api is not None
            name = f"reset-config-{job.name}"
            retry = 0
            try:
                cm = await api.get_config_map(job.namespace, name)
                retry = int(json.loads((cm.get("data") or {}).get("reset.json") or "{}").get("RetryTime", 0))
            except (KubeError, ValueError, TypeError, AttributeError):
                pass
            await self.write_reset(job, RetryTime=retry + 1, RestartFaultProcess=True, FaultFlushing=False)
            self.spawn(self.fault_retry(job), name=f"kube-fault-retry-{job.id}")
        elif d in CLEAR_DECISIONS or d.endswith("-success"):
            self._held.pop(job_id, None)
            await self.write_reset(job, RankList=[], FaultFlushing=False, RestartFaultProcess=False)
            await self.unlabel_pods(job_id)

    async def run(self) -> None:
        """Handle queued decisions in order, until cancelled; nothing raises out."""
        while True:
            await self._due.wait()
            self._due.clear()
            while self._queue:
                job_id, rec = self._queue.popleft()
                try:
                    await self.handle(job_id, rec)
                except Exception as e:  # one bad decision must not stop the hand-off
                    event(log, logging.ERROR, "kube hand-off failed", job=job_id, error=repr(e))


class PodGroupPlatform:
    """Platform mode's annotations (:mod:`clusterd.brain.platform`) on the job's PodGroup, as the
    reference keeps them: read from the PodGroups watch, written with a merge patch of
    ``metadata.annotations`` (retried, then counted as ``podgroup_annotation`` errors)."""

    def __init__(self, handoff: HandOff) -> None:
        self.h = handoff

    def get(self, job_id: str) -> dict[str, str]:
        """The platform keys among the PodGroup's annotations ({} without a PodGroup)."""
        pg = self.h.podgroups.get(job_id) or {}
        ann = (pg.get("metadata") or {}).get("annotations") or {}
        return {k: str(ann[k]) for k in PLATFORM_KEYS if k in ann}

    async def patch(self, job_id: str, changes: dict[str, str | None]) -> bool:
        """Set (None: remove) annotations on the PodGroup. False without PodGroup, API or on error."""
        pg = self.h.podgroups.get(job_id)
        api = self.h.api
        if pg is None or api is None:
            return False
        meta = pg["metadata"]
        body = {"metadata": {"annotations": changes}}
        ok = await self.h._call(
            "podgroup_annotation",
            lambda: api.patch_custom(
                pgs.GROUP, pgs.VERSION, meta["namespace"], pgs.PLURAL, meta["name"], body
            ),
        )
        if ok:  # the watch brings the change back later; the flow's next poll must see it now
            meta.setdefault("annotations", {}).update({k: v for k, v in changes.items() if v is not None})
            for k in [k for k, v in changes.items() if v is None]:
                meta["annotations"].pop(k, None)
        return ok
