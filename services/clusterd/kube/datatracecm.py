"""clusterd writes ``data-trace-<job>`` as the reference's ClusterD does (issue 29; clusterd.md §3).

Every accepted switch change (``ModifyTrainingDataTraceSwitch``, the slow-node detector's heavy
on/off through the brain's ``set_data_trace``) is written, after the switch is stored, to the
ConfigMap ``data-trace-<job>`` in the job's namespace: label ``reset: "true"``, data key
``profilingSwitch`` = compact JSON ``{"CommunicationOperator":..,"Step":..,"SaveCheckpoint":..,
"FP":..,"DataLoader":..}`` (that field order, the reference's Go struct), created when missing and
otherwise updated (a corrupt old value is overwritten). The job's deletion deletes it (the reference
lets the garbage collector do it through an OwnerReference to the job's owner).

Only the leader writes (:meth:`DataTraceConfigMaps.run` is a leader's writer); a follower drops the
change (it serves no RPC; the leader's own detector makes its own). A write that fails is answered
as the reference does: the RPC gets 500 ``failed to update comfigmap:[ns/job]`` (the switch stays
stored and is already sent to the nodes and subscribers, as in the reference, whose subscribers
are told first) and the write is retried in the background with :class:`faultmesh.retry.Backoff`
until it lands or a newer change replaces it. Writes are counted in
``faultmesh_kube_writes_total{kind="data_trace",result}``.

Echo guard: :attr:`DataTraceConfigMaps.known` keeps the switch each ConfigMap holds (written here or
applied from it); the ConfigMap reader (:mod:`clusterd.kube.control`) skips a version equal to it,
and a change equal to it is not written again. The text written is also kept in the store (the
reader's restart guard).

Deliberate differences: no OwnerReference (the job's deletion is observed instead); the success
message stays ``successfully changed profiling marker enable status`` on create too.
"""

from __future__ import annotations

import asyncio
import logging

import orjson

from clusterd.brain.datatrace import FIELDS, DataTraceError
from clusterd.kube.metrics import KubeMetrics
from faultmesh.kube import KubeApi, KubeError
from faultmesh.log import event
from faultmesh.retry import Backoff
from faultmesh.runtime import wait_for

log = logging.getLogger("clusterd.kube")

PREFIX = "data-trace-"
LABELS = {"reset": "true"}
KEY = "profilingSwitch"
STORE_NS = "kube.control"  # the ConfigMap reader's: "ns/data-trace-<job>" -> text applied or written
IDLE_S = 30.0


def switch_text(value: dict[str, str]) -> str:
    """The ``profilingSwitch`` value of a switch: compact JSON of the five FIELDS in order."""
    return orjson.dumps({f: str(value.get(f, "") or "") for f in FIELDS}).decode()


class DataTraceConfigMaps:
    """See the module docstring. ``api``: the Kubernetes client; ``metrics``: Kubernetes mode's
    (:class:`~clusterd.kube.metrics.KubeMetrics`); ``store``: clusterd's store; ``wait_s``: how long
    a change waits for its first write attempt (s) before the RPC is answered 500."""

    def __init__(self, api: KubeApi, metrics: KubeMetrics, store, wait_s: float) -> None:
        self.api = api
        self.metrics = metrics
        self.store = store
        self.wait_s = wait_s
        self.leading = False
        self.known: dict[tuple[str, str], dict[str, str]] = {}  # (ns, cm name) -> switch it holds
        self.want: dict[tuple[str, str], dict[str, str] | None] = {}  # to write (None: delete)
        self._waiters: dict[tuple[str, str], list[asyncio.Future]] = {}
        self._due = asyncio.Event()
        self.backoff = Backoff(0.5, 10.0)

    async def changed(self, namespace: str, job: str, value: dict[str, str]) -> None:
        """A stored switch change (the DataTrace sink): write it while leading and wait for the first
        attempt. Raises :class:`DataTraceError` 500 when that attempt failed or took over ``wait_s``."""
        key = (namespace, PREFIX + job)
        value = {f: str(value.get(f, "") or "") for f in FIELDS}
        if not self.leading or (key not in self.want and self.known.get(key) == value):
            return
        fut = asyncio.get_running_loop().create_future()
        self.want[key] = value
        self._waiters.setdefault(key, []).append(fut)
        self._due.set()
        try:
            error = await wait_for(asyncio.shield(fut), self.wait_s)
        except TimeoutError:
            error = f"no answer in {self.wait_s:g} s"
        if error:
            raise DataTraceError(500, f"failed to update comfigmap:[{namespace}/{job}]: {error}")

    def deleted(self, namespace: str, job: str) -> None:
        """The job was deleted: delete its ConfigMap (while leading; never waits)."""
        if self.leading:
            self.want[(namespace, PREFIX + job)] = None
            self._due.set()

    async def _apply(self, key: tuple[str, str], value: dict[str, str] | None) -> str:
        """One write or delete; "" on success, else the error (counted and logged)."""
        ns, name = key
        try:
            if value is None:
                try:
                    await self.api.delete_config_map(ns, name)
                except KubeError as e:
                    if e.status != 404:
                        raise
            else:
                await self.api.upsert_config_map(ns, name, {KEY: switch_text(value)}, LABELS)
        except KubeError as e:
            self.metrics.writes.labels("data_trace", "error").inc()
            self.metrics.api_errors.labels(e.op, str(e.status)).inc()
            event(
                log,
                logging.WARNING,
                "data-trace configmap write failed",
                configmap=f"{ns}/{name}",
                error=str(e),
            )
            return str(e) or repr(e)
        self.metrics.writes.labels("data_trace", "ok").inc()
        if value is None:
            self.known.pop(key, None)
            await self.store.kv_delete(STORE_NS, f"{ns}/{name}")
            event(log, logging.INFO, "data-trace configmap deleted with its job", configmap=f"{ns}/{name}")
        else:
            self.known[key] = value
            await self.store.kv_put(STORE_NS, f"{ns}/{name}", switch_text(value))
            event(log, logging.INFO, "data-trace configmap written", configmap=f"{ns}/{name}", **value)
        return ""

    async def run(self) -> None:
        """The writer (a leader's writer, :meth:`KubeSession.run_led`), until cancelled."""
        self.leading = True
        try:
            while True:
                try:
                    await wait_for(self._due.wait(), IDLE_S)
                except TimeoutError:
                    continue
                self._due.clear()
                failed = False
                for key in list(self.want):
                    value = self.want.pop(key)
                    error = await self._apply(key, value)
                    for fut in self._waiters.pop(key, []):
                        if not fut.done():
                            fut.set_result(error)
                    if error:
                        failed = True
                        self.want.setdefault(key, value)  # retried unless a newer change came
                if failed:
                    await asyncio.sleep(self.backoff.next_delay())
                    self._due.set()
                else:
                    self.backoff.reset()
        finally:
            self.leading = False
            self.want.clear()
            for futs in self._waiters.values():
                for fut in futs:
                    if not fut.done():
                        fut.set_result("leadership lost")
            self._waiters.clear()
