"""Failover keeps the record (issue 30): the fault history and the decision log across a leader change.

The state mirror (:mod:`clusterd.kube.hastate`) keeps what a sender was told succeeded, written
before the acknowledgement. The fault history (``/v1/events``: every occur / update / recover and
every operator row) and the brain's decision log (``/v1/jobs/<id>/recovery``) are acknowledged to
nobody, so they stay out of that path: :class:`HistoryStore` offers every history row and every
decision write *after* SQLite took it to :class:`HistoryMirror`, which keeps a bounded recent
window in memory and writes it to a ConfigMap of its own from its own task. A slow or failing API
server never delays a fault, an acknowledgement or a decision: the offer never waits (a
:class:`faultmesh.sink.SinkWorker`), the window is written at most every
``--kube-history-write-interval-s`` (1 s) and a failed write is retried with backoff (counted in
``faultmesh_kube_history_writes_total{result="error"}`` and ``..._retries_total{reason}``).

**Window.** The newest ``--kube-history-max-events`` (20 000) history rows and the newest
``--kube-history-max-decisions`` (2 000) decisions, each no older than ``--kube-history-window-s``
(24 h), whichever is smaller. At the default sizes the document is about 570 kB encoded, 40 ms to encode
(``bench/ha_history.py``); one that would exceed ``--kube-state-max-bytes`` (900 000) has its
oldest quarter dropped until it fits, counted in ``faultmesh_kube_history_trimmed_total{kind}``.

**Document.** ConfigMap ``--kube-history-name`` (default ``<--kube-state-name>-history``:
``faultmesh-clusterd-state-history``), ``binaryData["history.json.gz"]`` the gzip of the JSON
``{"version": 1, "written_ms": ..., "events": [[ts_ms, kind, node, device_type, device_id, code,
source, level, assertion, attributes], ...], "decisions": [[job_id, record], ...]}`` (oldest first),
``data["sha256"]`` its digest (:mod:`clusterd.kube.cmdoc`, as the state document).

**Election.** The new leader reads the document before ClusterD starts serving (:meth:`HistoryStore.open`)
and imports its rows into the fresh SQLite history and its decisions into the ``decisions``
namespace the brain loads, then carries them on in its own window (a second failover keeps them).
A document that fails its checks (missing key, bad encoding, too large, checksum mismatch, bad JSON,
unknown version, bad shape) is rejected: logged (``history configmap rejected``), counted in
``faultmesh_kube_history_rejected_total{reason}``, copied to ``<name>-rejected``; a malformed row is
skipped (``bad record``). An API server that does not answer within ``--kube-state-write-s`` is
logged (``history configmap not read``). In each case the leader starts with the history it has
(none) -- history never blocks an election.

**What a failover loses.** The rows recorded since the last write that reached the API server: at
most the write interval plus one write (about 1-2 s of history) when the API server answers, more
while it does not (``faultmesh_kube_history_unwritten_rows`` is that tail); and whatever is outside
the window. A graceful stop writes the tail before the Lease is released.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

import orjson
from prometheus_client import CollectorRegistry, Counter, Gauge

from clusterd.brain.decisions import NS as DECISIONS_NS
from clusterd.kube.cmdoc import StateRejected, pack, unpack
from clusterd.kube.hastate import KubeState, MirroredStore, StateMetrics, StateWriteError
from faultmesh.log import event
from faultmesh.model import Fault, now_ms
from faultmesh.retry import Backoff
from faultmesh.runtime import wait_for
from faultmesh.sink import SinkWorker

log = logging.getLogger("clusterd.kube.ha")

VERSION = 1
BLOB_KEY = "history.json.gz"
LABELS = {"app.kubernetes.io/managed-by": "faultmesh", "app.kubernetes.io/component": "clusterd-history"}
DEFAULT_MAX_EVENTS = 20_000
DEFAULT_MAX_DECISIONS = 2_000
QUEUE_MAX = 4096  # batches the mirror may fall behind (never, in practice: applying one is a list append)

Event = tuple[int, str, Fault]  # (ts_ms, kind, fault) as clusterd.store.Store.append_events takes it


def add_arguments(g: argparse._ArgumentGroup) -> None:
    """The history mirror's flags (on clusterd's Kubernetes argument group ``g``)."""
    g.add_argument("--kube-history-name", default="",
                   help="ConfigMap keeping the recent fault history and decisions across a leader change "
                   "(default: <--kube-state-name>-history)")  # fmt: skip
    g.add_argument("--kube-history-max-events", type=int, default=DEFAULT_MAX_EVENTS,
                   help="history rows the mirror keeps (the newest)")  # fmt: skip
    g.add_argument("--kube-history-max-decisions", type=int, default=DEFAULT_MAX_DECISIONS,
                   help="recovery decisions the mirror keeps (the newest)")  # fmt: skip
    g.add_argument("--kube-history-window-s", type=float, default=86400.0,
                   help="the mirror keeps rows and decisions at most this old (s)")  # fmt: skip
    g.add_argument("--kube-history-write-interval-s", type=float, default=1.0,
                   help="the history mirror is written at most this often (s)")  # fmt: skip


class HistoryMetrics(StateMetrics):
    """:class:`~clusterd.kube.hastate.StateMetrics` named ``faultmesh_kube_history_*``, plus
    ``faultmesh_kube_history_trimmed_total{kind}`` (rows dropped to fit the bound) and
    ``faultmesh_kube_history_unwritten_rows`` (rows and decisions recorded, not yet in the ConfigMap:
    what a failover now would lose)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        names = (
            "faultmesh_kube_history_writes_total", "faultmesh_kube_history_retries_total",
            "faultmesh_kube_history_rejected_total", "faultmesh_kube_history_bytes",
        )  # fmt: skip
        super().__init__(registry, names, "history mirror")
        self.trimmed = Counter("faultmesh_kube_history_trimmed_total",
                               "History mirror rows dropped to fit the ConfigMap bound", ["kind"],
                               registry=registry)  # fmt: skip
        self.unwritten = Gauge("faultmesh_kube_history_unwritten_rows",
                               "History rows and decisions not yet written to the history ConfigMap",
                               registry=registry)  # fmt: skip

    def collectors(self) -> tuple:
        """Every metric (to add to another registry)."""
        return self.writes, self.retries, self.rejected, self.bytes, self.trimmed, self.unwritten


def event_row(ts_ms: int, kind: str, f: Fault) -> list:
    """The document's row of one history row."""
    return [ts_ms, kind, f.node, f.device_type, f.device_id, f.code, f.source, f.level, f.assertion,
            dict(f.attributes)]  # fmt: skip


def row_event(row: Any) -> Event:
    """(ts_ms, kind, fault) of a document row. Raises ``ValueError`` / ``TypeError`` on a bad row."""
    ts, kind, node, dt, dev, code, source, level, assertion, attrs = row
    if not all(isinstance(v, str) for v in (kind, node, dt, code, source, level, assertion)):
        raise TypeError("history row: a text field is not a string")
    if not isinstance(attrs, dict) or not all(type(v) is int for v in (ts, dev)):
        raise TypeError("history row: bad attributes or numbers")
    return ts, kind, Fault(source, node, dt, dev, code, level, assertion, attributes=attrs)


def decode(cm: dict) -> dict:
    """The history document in ``cm``. Raises :class:`~clusterd.kube.cmdoc.StateRejected` (the
    reasons of :func:`~clusterd.kube.cmdoc.unpack`, ``unknown version``, ``bad shape``)."""
    doc = unpack(cm, BLOB_KEY)
    if not isinstance(doc, dict) or doc.get("version") != VERSION:
        raise StateRejected("unknown version", repr(doc.get("version") if isinstance(doc, dict) else doc))
    events, decisions = doc.get("events", []), doc.get("decisions", [])
    if not isinstance(events, list) or not isinstance(decisions, list):
        raise StateRejected("bad shape", "events and decisions must be lists")
    return {"version": VERSION, "events": events, "decisions": decisions}


def encode(doc: dict) -> dict[str, dict[str, str]]:
    """The ConfigMap fields of the history document ``doc``."""
    return pack(orjson.dumps(doc, option=orjson.OPT_NON_STR_KEYS), BLOB_KEY)


IDLE_S = 60.0  # the writer's idle wake-up (s)


class HistoryMirror(KubeState):
    """The recent window and its ConfigMap (see the module docstring). Reuses the state mirror's
    fenced, retried ConfigMap writes (:class:`~clusterd.kube.hastate.KubeState`); ``metrics`` a
    :class:`HistoryMetrics`. :meth:`restore` on election, then :meth:`start`, :meth:`stop`."""

    labels = LABELS

    def __init__(self, api, namespace: str, name: str, identity: str, leading, metrics: HistoryMetrics,
                 max_bytes: int, write_s: float, max_events: int = DEFAULT_MAX_EVENTS,
                 max_decisions: int = DEFAULT_MAX_DECISIONS, window_s: float = 86400.0,
                 interval_s: float = 1.0) -> None:  # fmt: skip
        super().__init__(api, namespace, name, identity, leading, metrics, max_bytes, write_s)
        self.hm = metrics
        self.events: deque[list] = deque(maxlen=max(1, max_events))
        self.decisions: dict[str, list[dict]] = {}  # job id -> its records as last stored
        self.max_decisions = max(1, max_decisions)
        self.window_ms = int(window_s * 1000)
        self.interval_s = interval_s
        self.worker: SinkWorker[tuple] = SinkWorker("history-mirror", self._apply, maxsize=QUEUE_MAX)
        self._dirty = asyncio.Event()
        self._unwritten = 0
        self._failing = False
        self._tasks: list[asyncio.Task] = []

    # -- election ----------------------------------------------------------------------------------
    async def restore(self) -> tuple[list[Event], dict[str, list[dict]]]:
        """Read the document: (history rows, job id -> decisions), oldest first, and seed the window
        with them. Never raises: an unreadable or rejected document gives ([], {})."""
        try:
            cm = await self._retry("read", self._get)
        except StateWriteError as e:
            event(log, logging.ERROR, "history configmap not read", name=self.name, error=str(e))
            return [], {}
        if cm is None:
            return [], {}
        try:
            doc = await self.offload(decode, cm)
        except StateRejected as e:
            self.metrics.rejected.labels(e.reason).inc()
            event(log, logging.ERROR, "history configmap rejected", name=self.name, reason=e.reason,
                  error=str(e))  # fmt: skip
            await self._keep_rejected(cm, e)
            return [], {}
        events: list[Event] = []
        for row in doc["events"]:
            self._restore(lambda r=row: events.append(row_event(r)))
        decisions: dict[str, list[dict]] = {}
        for row in doc["decisions"]:
            self._restore(lambda r=row: self._put_decision(decisions, r))
        self.events.extend(event_row(*e) for e in events)
        self.decisions = {job: list(recs) for job, recs in decisions.items()}
        self.metrics.bytes.set(len(cm["binaryData"][BLOB_KEY]))
        return events, decisions

    @staticmethod
    def _put_decision(into: dict[str, list[dict]], row: Any) -> None:
        job, rec = row
        if not isinstance(job, str) or not isinstance(rec, dict) or type(rec.get("time_ms")) is not int:
            raise TypeError("decision row: [job id, {time_ms: int, ...}] expected")
        into.setdefault(job, []).append(rec)

    # -- offers (never wait) -----------------------------------------------------------------------
    def offer_events(self, rows: Sequence[Event]) -> None:
        """History rows SQLite took (in that order)."""
        if rows:
            self.worker.offer([("e", [event_row(*r) for r in rows])])

    def offer_decisions(self, job_id: str, records: list) -> None:
        """The decisions of ``job_id`` as just stored (the whole list, as the brain writes it)."""
        if isinstance(records, list):
            self.worker.offer([("d", job_id, [r for r in records if isinstance(r, dict)])])

    def _apply(self, batch: Sequence[tuple]) -> None:
        for item in batch:
            if item[0] == "e":
                self.events.extend(item[1])
                self._unwritten += len(item[1])
            else:
                old = self.decisions.get(item[1], [])
                self.decisions[item[1]] = item[2]
                self._unwritten += max(1, len(item[2]) - len(old))
        self.hm.unwritten.set(self._unwritten)
        self._dirty.set()

    # -- the writer --------------------------------------------------------------------------------
    def doc(self) -> dict:
        """The window's document (rows and decisions no older than the window, oldest first)."""
        now = now_ms()
        cutoff = now - self.window_ms
        while self.events and self.events[0][0] < cutoff:
            self.events.popleft()
        flat = [(r["time_ms"], job, r) for job, recs in self.decisions.items() for r in recs
                if r.get("time_ms", 0) >= cutoff]  # fmt: skip
        flat.sort(key=lambda x: x[0])
        return {"version": VERSION, "written_ms": now, "events": [e for e in self.events if e[0] >= cutoff],
                "decisions": [[job, r] for _, job, r in flat[-self.max_decisions :]]}  # fmt: skip

    async def _encode_fitting(self, doc: dict) -> dict[str, dict[str, str]]:
        """Encode ``doc`` (off the loop); drop its oldest quarter until it fits the bound (counted)."""
        while True:
            fields = await self.offload(encode, doc)
            size = len(fields["binaryData"][BLOB_KEY])
            if size <= self.max_bytes or not (doc["events"] or doc["decisions"]):
                self.metrics.bytes.set(size)
                return fields
            for kind in ("events", "decisions"):
                cut = (len(doc[kind]) + 3) // 4
                doc[kind] = doc[kind][cut:]
                self.hm.trimmed.labels(kind).inc(cut)
            self.events = deque(list(self.events)[-max(1, len(doc["events"])) :], maxlen=self.events.maxlen)
            self.max_decisions = max(1, len(doc["decisions"]))
            event(log, logging.WARNING, "history mirror trimmed", name=self.name, bytes=size,
                  max_bytes=self.max_bytes, events=len(doc["events"]), decisions=len(doc["decisions"]))  # fmt: skip

    async def write_once(self) -> bool:
        """Write the window now. True when the ConfigMap took it; a failure is counted, logged once
        per failing streak and left for the next round."""
        self._dirty.clear()
        unwritten = self._unwritten
        try:
            fields = await self._encode_fitting(self.doc())
            await self._retry("write", lambda: self._write(fields))
        except StateWriteError as e:
            self.metrics.writes.labels("error").inc()
            if not self._failing:
                event(log, logging.ERROR, "history write failed", name=self.name, error=str(e))
            self._failing = True
            self._dirty.set()
            return False
        self.metrics.writes.labels("ok").inc()
        self._unwritten -= unwritten
        self.hm.unwritten.set(self._unwritten)
        if self._failing:
            event(log, logging.INFO, "history written after retries", name=self.name)
            self._failing = False
        return True

    async def _run(self) -> None:
        backoff = Backoff(self.interval_s, 30.0)
        while True:
            try:  # idle: wake now and then (every wait bounded), write only what is dirty
                await wait_for(self._dirty.wait(), IDLE_S)
            except TimeoutError:
                continue
            await asyncio.sleep(self.interval_s)  # coalesce: one write per interval at most
            try:
                ok = await self.write_once()
            except Exception as e:  # e.g. a record orjson cannot encode: the writer must go on
                self.metrics.writes.labels("error").inc()
                event(log, logging.ERROR, "history write failed", name=self.name, error=repr(e))
                ok = False
            if ok:
                backoff.reset()
            else:
                await asyncio.sleep(backoff.next_delay())

    def start(self) -> None:
        """Start the subscriber's and the writer's tasks (owned here; :meth:`stop` ends them)."""
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self.worker.run(), name="kube-history-sink"),
                       loop.create_task(self._run(), name="kube-history-writer")]  # fmt: skip

    async def stop(self, timeout_s: float = 5.0) -> None:
        """Apply what was offered, write the tail once more (while leading, within ``timeout_s``) and
        end the tasks."""
        await self.worker.drain(min(1.0, timeout_s))
        for t in self._tasks[1:]:
            t.cancel()
        if self._tasks and self._dirty.is_set() and self.leading():
            try:
                async with asyncio.timeout(timeout_s):
                    await self.write_once()
            except TimeoutError:
                event(log, logging.WARNING, "history tail not written", name=self.name, rows=self._unwritten)
        for t in self._tasks:
            t.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=5)
        self._tasks = []


class HistoryStore(MirroredStore):
    """:class:`~clusterd.kube.hastate.MirroredStore` whose history rows and decision writes are
    offered to ``history`` (a :class:`HistoryMirror`) once SQLite took them; :meth:`open` imports the
    mirrored window before anything is served."""

    def __init__(self, state: KubeState, history: HistoryMirror, state_dir, **kw: Any) -> None:
        super().__init__(state, state_dir, **kw)
        self.history = history

    async def open(self) -> None:
        await super().open()
        events, decisions = await self.history.restore()
        await super().append_events(events)
        for job_id, records in decisions.items():
            await super().kv_put(DECISIONS_NS, job_id, records)
        event(log, logging.INFO, "history restored from configmap", name=self.history.name,
              events=len(events), decisions=sum(len(r) for r in decisions.values()))  # fmt: skip
        self.history.start()

    async def close(self) -> None:
        await self.history.stop()
        await super().close()

    async def append_events(self, events: Iterable[Event]) -> None:
        rows = list(events)
        await super().append_events(rows)
        self.history.offer_events(rows)

    async def kv_put(self, ns: str, key: str, value: Any) -> None:
        await super().kv_put(ns, key, value)
        if ns == DECISIONS_NS:
            self.history.offer_decisions(key, value)
