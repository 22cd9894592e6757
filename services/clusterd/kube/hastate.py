"""What must survive a leader loss, kept in a ConfigMap of faultmesh's own (issue 15 HA).

With ``--kube-leader-elect on`` the clusterd process (:mod:`clusterd.kube.ha`) runs ClusterD on a
:class:`MirroredStore`: the usual SQLite file (a scratch copy, rebuilt at each election) plus a
write-through mirror of the durable state that agents cannot re-send:

- the fault center's records of origin ``public`` (PubFault RPCs and public-fault ConfigMaps);
- the key-value namespaces of :data:`MIRRORED_NS`: the job registry with each job's recovery state
  (``jobs``), pod-derived jobs (``kube-jobs``), data-trace switches (``datatrace``), slow-node jobs
  (``slownode.jobs``), the slow-net configuration (``slownet``), the jobs whose Recover Init was
  accepted (``recover_init``: TaskD's manager calls Init once per process, then only Register) and the
  public recovers that came before their occur (``pubfault_pending``);
- the manual separations (:mod:`clusterd.separation`).

Agent faults and node states are not mirrored: each agent re-sends its snapshot to the new leader.
The fault history and the decision log have a mirror of their own, written after the fact
(:mod:`clusterd.kube.hahistory`).

**Document.** ConfigMap ``--kube-state-name`` (``faultmesh-clusterd-state``) in the Lease's namespace,
label ``app.kubernetes.io/managed-by=faultmesh``. ``binaryData["state.json.gz"]`` is the gzip of
the JSON ``{"version": 1, "faults": [[node, device_type, device_id, code, source, level,
assertion, first_seen_ms, last_seen_ms, attributes, origin], ...], "kv": {ns: {key: value}},
"separations": [[node, device_id, codes, separated_ms, last_fault_ms], ...]}`` (compressed: public
fault rows repeat themselves, about 10x smaller), ``data["sha256"]`` the hex digest of that JSON.
Read it with ``kubectl get cm faultmesh-clusterd-state -o jsonpath='{.binaryData.state\\.json\\.gz}'
| base64 -d | gunzip``.

**Durability.** Every mirrored change is written to the ConfigMap *before* the SQLite commit and so
before the caller acknowledges its sender (a PubFault answer 0, an HTTP 200). A write that fails
(the API server down for ``--kube-state-write-s``, not the leader any more, the document over its
bound) raises :class:`StateWriteError`: the mirror is put back, SQLite is not touched and the caller
answers an error (the fault center undoes the batch, never acks). A write whose answer was lost
(timeout after the server applied it) may leave an unacknowledged change in the ConfigMap until the
next write: a new leader may then hold a change nobody was told succeeded, never lose an acked one.

**Bound.** The encoded ``state.json.gz`` may hold at most ``--kube-state-max-bytes`` (900 000; the
API server refuses a ConfigMap over 1 MiB), which is about 29 000 public fault records
(``bench/ha_state.py``). A change that would grow it past the bound is refused with
``StateWriteError("state ConfigMap full")``, counted as
``faultmesh_kube_state_rejected_total{reason="too large"}``; the state already stored stays as it
was. Encoding (JSON + gzip, about 0.25 s at that size) and decoding run in the store's worker
thread, not on the event loop.

**API errors** are retried with :class:`faultmesh.retry.Backoff` until ``--kube-state-write-s`` and
counted by reason in ``faultmesh_kube_state_retries_total{reason}``: ``conflict`` (409: the
resourceVersion moved; re-read and write again), ``missing`` (404: re-created), ``throttled`` (429),
``timeout`` (no answer), ``server`` (5xx). Other 4xx answers fail at once.

**Bad documents.** On election the new leader reads the ConfigMap (:meth:`KubeState.load`). A
document with a missing key, a bad encoding (not base64 / gzip, or cut short), more than 64 MiB
inflated, a wrong checksum, bad JSON, an unknown version or a wrong shape is rejected — logged with its reason, counted in ``faultmesh_kube_state_rejected_total{reason}``,
copied to ``<name>-rejected`` for the operator — and the leader starts from an empty state plus the
agents' snapshots. A single malformed record inside a valid document is skipped and counted
(``bad record``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import orjson
from prometheus_client import CollectorRegistry, Counter, Gauge

from clusterd.kube.cmdoc import StateRejected, retry_reason, unpack
from clusterd.kube.cmdoc import pack as pack_doc
from clusterd.store import Store
from faultmesh.kube import KubeApi, KubeError
from faultmesh.log import event
from faultmesh.model import Fault, FaultKey
from faultmesh.retry import Backoff

log = logging.getLogger("clusterd.kube.ha")

VERSION = 1
BLOB_KEY = "state.json.gz"
LABELS = {"app.kubernetes.io/managed-by": "faultmesh", "app.kubernetes.io/component": "clusterd-state"}
MIRRORED_ORIGINS = frozenset({"public"})
MIRRORED_NS = frozenset(
    {"jobs", "kube-jobs", "datatrace", "slownode.jobs", "slownet", "recover_init", "pubfault_pending"}
)
DEFAULT_MAX_BYTES = 900_000
_MISSING = object()


class StateWriteError(OSError):
    """A mirrored change could not be written to the state ConfigMap (the caller answers an error)."""


# the HA state document's metrics: writes{result}, retries{reason}, rejected{reason}, encoded bytes
STATE_METRICS = (
    "faultmesh_kube_state_writes_total", "faultmesh_kube_state_retries_total",
    "faultmesh_kube_state_rejected_total", "faultmesh_kube_state_bytes",
)  # fmt: skip


class StateMetrics:
    """The metrics of one ConfigMap document ``what``, named by ``names`` (writes ``{result}``,
    retries ``{reason}``, rejected ``{reason}``, bytes): :data:`STATE_METRICS` for the HA state, the
    history mirror's ``faultmesh_kube_history_*`` (:mod:`clusterd.kube.hahistory`)."""

    def __init__(
        self,
        registry: CollectorRegistry,
        names: tuple[str, str, str, str] = STATE_METRICS,
        what: str = "HA state",
    ) -> None:
        writes, retries, rejected, size = names
        self.writes = Counter(writes, f"Writes of the {what} ConfigMap", ["result"], registry=registry)
        self.retries = Counter(retries, f"Retried API calls on the {what} ConfigMap, by reason",
                               ["reason"], registry=registry)  # fmt: skip
        self.rejected = Counter(rejected, f"Rejected {what} documents and changes, by reason",
                                ["reason"], registry=registry)  # fmt: skip
        self.bytes = Gauge(size, f"Size of the {what} document (encoded bytes)", registry=registry)


def fault_row(f: Fault, origin: str) -> list:
    """The document's row of one fault record."""
    return [f.node, f.device_type, f.device_id, f.code, f.source, f.level, f.assertion,
            f.first_seen_ms, f.last_seen_ms, dict(f.attributes), origin]  # fmt: skip


def row_fault(row: list) -> tuple[Fault, str]:
    """(fault, origin) of a document row. Raises ``ValueError`` / ``TypeError`` on a bad row."""
    node, dt, dev, code, source, level, assertion, first, last, attrs, origin = row
    if not all(isinstance(v, str) for v in (node, dt, code, source, level, assertion, origin)):
        raise TypeError("fault row: a text field is not a string")
    if not isinstance(attrs, dict) or not all(isinstance(v, int) for v in (dev, first, last)):
        raise TypeError("fault row: bad attributes or numbers")
    fault = Fault(source, node, dt, dev, code, level, assertion, first, last,
                  {str(k): str(v) for k, v in attrs.items()})  # fmt: skip
    return fault, origin


def pack(body: bytes) -> dict[str, dict[str, str]]:
    """The ConfigMap fields (``data``, ``binaryData``) holding the JSON ``body``."""
    return pack_doc(body, BLOB_KEY)


def encode(doc: Any) -> dict[str, dict[str, str]]:
    """The ConfigMap fields (``data``, ``binaryData``) of the document ``doc``."""
    return pack(orjson.dumps(doc, option=orjson.OPT_NON_STR_KEYS))


def decode(cm: dict) -> dict:
    """The document in the ConfigMap ``cm``. Raises :class:`StateRejected` (the reasons of
    :func:`clusterd.kube.cmdoc.unpack`, ``unknown version``, ``bad shape``)."""
    doc = unpack(cm, BLOB_KEY)
    if not isinstance(doc, dict) or doc.get("version") != VERSION:
        raise StateRejected("unknown version", repr(doc.get("version") if isinstance(doc, dict) else doc))
    faults, kv, seps = doc.get("faults", []), doc.get("kv", {}), doc.get("separations", [])
    if not isinstance(faults, list) or not isinstance(seps, list) or not isinstance(kv, dict):
        raise StateRejected("bad shape", "faults and separations must be lists, kv an object")
    if not all(isinstance(v, dict) for v in kv.values()):
        raise StateRejected("bad shape", "every kv namespace must be an object")
    return {"version": VERSION, "faults": faults, "kv": kv, "separations": seps}


class KubeState:
    """The in-memory copy of the state document and its write-through to the ConfigMap.

    ``leading()`` fences every write (a replica that lost the Lease writes nothing); ``max_bytes``
    bounds ``state.json``; a write retries for ``write_s`` seconds. See the module docstring.
    """

    labels = LABELS  # of the ConfigMap written

    def __init__(
        self,
        api: KubeApi,
        namespace: str,
        name: str,
        identity: str,
        leading: Callable[[], bool],
        metrics: StateMetrics,
        max_bytes: int = DEFAULT_MAX_BYTES,
        write_s: float = 10.0,
    ) -> None:
        self.api, self.namespace, self.name, self.identity = api, namespace, name, identity
        self.leading = leading
        self.metrics = metrics
        self.max_bytes = max_bytes
        self.write_s = write_s
        self.faults: dict[tuple, list] = {}
        self.kv: dict[str, dict[str, Any]] = {}
        self.seps: dict[tuple[str, int], list] = {}
        self._rv: str | None = None
        self._exists = False
        self.lock = asyncio.Lock()
        self.offload: Callable[..., Any] = asyncio.to_thread  # encode (JSON + gzip) off the loop

    # -- reading ---------------------------------------------------------------------------------
    async def load(self) -> int:
        """Read the ConfigMap into memory (absent: empty; rejected: empty, see the module docstring).
        Retries API errors for ``write_s``. Returns how many records were restored.
        Raises :class:`StateWriteError` when it cannot be read."""
        cm = await self._retry("read", self._get)
        self.faults, self.kv, self.seps = {}, {}, {}
        if cm is None:
            return 0
        try:
            doc = await self.offload(decode, cm)
        except StateRejected as e:
            self.metrics.rejected.labels(e.reason).inc()
            event(
                log, logging.ERROR, "state configmap rejected", name=self.name, reason=e.reason, error=str(e)
            )
            await self._keep_rejected(cm, e)
            return 0
        n = 0
        for row in doc["faults"]:
            n += self._restore(lambda r=row: self._put_fault(*row_fault(r)))
        for ns, items in doc["kv"].items():
            for key, value in items.items():
                self.kv.setdefault(str(ns), {})[str(key)] = value
                n += 1
        for row in doc["separations"]:
            n += self._restore(lambda r=row: self._put_sep(*r))
        self.metrics.bytes.set(len(cm["binaryData"][BLOB_KEY]))
        return n

    def _restore(self, put: Callable[[], None]) -> int:
        try:
            put()
            return 1
        except (TypeError, ValueError) as e:
            self.metrics.rejected.labels("bad record").inc()
            event(log, logging.WARNING, "state record skipped", name=self.name, error=str(e))
            return 0

    def _put_fault(self, f: Fault, origin: str) -> None:
        self.faults[tuple(f.key)] = fault_row(f, origin)

    def _put_sep(self, node, dev, codes, sep_ms, last_ms) -> None:
        if not isinstance(node, str) or not isinstance(codes, str):
            raise TypeError("separation row: node and codes must be strings")
        self.seps[(node, int(dev))] = [node, int(dev), codes, int(sep_ms), int(last_ms)]

    async def _get(self) -> dict | None:
        try:
            cm = await self.api.get_config_map(self.namespace, self.name)
        except KubeError as e:
            if e.status == 404:
                self._exists, self._rv = False, None
                return None
            raise
        self._exists = True
        self._rv = (cm.get("metadata") or {}).get("resourceVersion") or None
        return cm

    async def _keep_rejected(self, cm: dict, why: StateRejected) -> None:
        """Best effort: copy a rejected document to ``<name>-rejected`` for the operator."""
        name = f"{self.name}-rejected"
        data = {k: str(v) for k, v in (cm.get("data") or {}).items()}
        data["rejected-reason"] = str(why)
        body = {"apiVersion": "v1", "kind": "ConfigMap", "data": data, "binaryData": cm.get("binaryData") or {},
                "metadata": {"name": name, "namespace": self.namespace, "labels": self.labels}}  # fmt: skip
        try:
            await self.api.patch_config_map(
                self.namespace, name, {k: body[k] for k in ("data", "binaryData")}
            )
        except KubeError as e:
            if e.status == 404:
                with contextlib.suppress(KubeError):
                    await self.api.create_config_map(self.namespace, body)

    # -- writing ---------------------------------------------------------------------------------
    def doc(self) -> dict:
        """The current document."""
        return {
            "version": VERSION,
            "faults": list(self.faults.values()),
            "kv": {ns: dict(items) for ns, items in self.kv.items() if items},
            "separations": list(self.seps.values()),
        }

    async def commit(self, undo: list[tuple[dict, Any, Any]]) -> None:
        """Write the document after in-memory changes whose previous values are ``undo``
        ((dict, key, old value or missing) triples); on failure put them back and raise
        :class:`StateWriteError`. The caller holds :attr:`lock`."""
        try:
            fields = await self.offload(encode, self.doc())
            size = len(fields["binaryData"][BLOB_KEY])
            if size > self.max_bytes:
                self.metrics.rejected.labels("too large").inc()
                raise StateWriteError(f"state ConfigMap full: {size} > {self.max_bytes} bytes")
            await self._retry("write", lambda: self._write(fields))
            self.metrics.writes.labels("ok").inc()
            self.metrics.bytes.set(size)
        except BaseException as e:
            for d, key, old in reversed(undo):
                if old is _MISSING:
                    d.pop(key, None)
                else:
                    d[key] = old
            if isinstance(e, StateWriteError):
                self.metrics.writes.labels("error").inc()
                event(log, logging.ERROR, "state write failed", name=self.name, error=str(e))
            raise

    async def _write(self, fields: dict[str, dict[str, str]]) -> None:
        meta: dict[str, Any] = {"labels": self.labels, "annotations": {"faultmesh.io/writer": self.identity}}
        if not self._exists:
            body = {"apiVersion": "v1", "kind": "ConfigMap", **fields,
                    "metadata": {"name": self.name, "namespace": self.namespace, **meta}}  # fmt: skip
            try:
                out = await self.api.create_config_map(self.namespace, body)
            except KubeError as e:
                if e.status == 409:
                    self._exists = True  # someone (we, before a lost answer?) created it: update
                raise
        else:
            if self._rv:
                meta["resourceVersion"] = self._rv  # optimistic lock: 409 when it moved
            out = await self.api.patch_config_map(self.namespace, self.name, {"metadata": meta, **fields})
        self._exists = True
        self._rv = (out.get("metadata") or {}).get("resourceVersion") or None

    async def _retry(self, what: str, fn: Callable[[], Any]) -> Any:
        deadline = time.monotonic() + self.write_s
        backoff = Backoff(0.1, 2.0)
        while True:
            if what == "write" and not self.leading():
                self.metrics.rejected.labels("not leader").inc()
                raise StateWriteError("not the leader: state not written")
            try:
                return await fn()
            except KubeError as e:
                reason = retry_reason(e.status)
                if reason is None:
                    raise StateWriteError(f"state {what} refused: {e}") from None
                self.metrics.retries.labels(reason).inc()
                event(log, logging.WARNING, "state api call retried", op=what, reason=reason, error=str(e))
                if reason == "conflict" and what == "write" and self._exists:
                    with contextlib.suppress(KubeError):
                        await self._get()  # the current resourceVersion
                elif reason == "missing":
                    self._exists, self._rv = False, None
                left = deadline - time.monotonic()
                if left <= 0:
                    raise StateWriteError(f"state {what} failed for {self.write_s:g} s: {e}") from None
                await asyncio.sleep(min(left, backoff.next_delay()))

    # -- changes (each returns its undo list; the caller commits) ---------------------------------
    @staticmethod
    def _set(undo: list, d: dict, key: Any, value: Any) -> None:
        undo.append((d, key, d.get(key, _MISSING)))
        if value is _MISSING:
            d.pop(key, None)
        else:
            d[key] = value

    def change_faults(self, upserts: list[tuple[Fault, str]], removals: list[FaultKey]) -> list:
        """Apply a fault-center batch to the mirror: public records in, everything else out."""
        undo: list = []
        for f, origin in upserts:
            k = tuple(f.key)
            if origin in MIRRORED_ORIGINS:
                self._set(undo, self.faults, k, fault_row(f, origin))
            elif k in self.faults:
                self._set(undo, self.faults, k, _MISSING)
        for key in removals:
            if tuple(key) in self.faults:
                self._set(undo, self.faults, tuple(key), _MISSING)
        return undo

    def change_kv(self, ns: str, key: str, value: Any) -> list:
        """Put (``value``) or delete (missing) one mirrored key."""
        undo: list = []
        if ns not in self.kv:
            self._set(undo, self.kv, ns, {})
        self._set(undo, self.kv[ns], key, value)
        return undo

    def change_sep(self, node: str, dev: int, row: list | None) -> list:
        """Put (``row``) or delete (None) one separation."""
        undo: list = []
        self._set(undo, self.seps, (node, int(dev)), _MISSING if row is None else row)
        return undo


class MirroredStore(Store):
    """:class:`clusterd.store.Store` whose durable writes go to ``state`` (a :class:`KubeState`)
    first. :meth:`open` starts a fresh SQLite file filled from the ConfigMap (see the module
    docstring). Methods raise :class:`StateWriteError` besides ``sqlite3.Error``."""

    def __init__(self, state: KubeState, state_dir: str | Path, **kw: Any) -> None:
        super().__init__(state_dir, **kw)
        self.state = state
        state.offload = self._run  # the store's own worker thread
        self.restored = 0

    def _wipe(self) -> None:
        for suffix in ("", "-wal", "-shm"):  # the ConfigMap is the truth: no stale local rows
            Path(f"{self.path}{suffix}").unlink(missing_ok=True)

    async def open(self) -> None:
        await self._run(self._wipe)
        await super().open()
        st = self.state
        self.restored = await st.load()
        await super().write_faults([row_fault(r) for r in st.faults.values()], [])
        for ns, items in st.kv.items():
            for key, value in items.items():
                await super().kv_put(ns, key, value)
        for node, dev, codes, sep_ms, last_ms in st.seps.values():
            await super().put_separation(node, dev, codes, sep_ms, last_ms)
        event(log, logging.INFO, "state restored from configmap", name=st.name, records=self.restored)

    async def write_faults(
        self,
        upserts: Iterable[tuple[Fault, str]] = (),
        removals: Iterable[FaultKey] = (),
        marks: dict[tuple[str, str], bytes | None] | None = None,
    ) -> None:
        up, rm = list(upserts), list(removals)
        async with self.state.lock:
            undo = self.state.change_faults(up, rm)
            if undo:
                await self.state.commit(undo)
            await super().write_faults(up, rm, marks)  # marks (agent digests): SQLite only

    async def kv_put(self, ns: str, key: str, value: Any) -> None:
        if ns not in MIRRORED_NS:
            return await super().kv_put(ns, key, value)
        value = orjson.loads(orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS))  # as SQLite keeps it
        async with self.state.lock:
            await self.state.commit(self.state.change_kv(ns, key, value))
            await super().kv_put(ns, key, value)

    async def kv_delete(self, ns: str, key: str) -> None:
        if ns not in MIRRORED_NS or key not in self.state.kv.get(ns, {}):
            return await super().kv_delete(ns, key)
        async with self.state.lock:
            await self.state.commit(self.state.change_kv(ns, key, _MISSING))
            await super().kv_delete(ns, key)

    async def put_separation(
        self, node: str, device_id: int, codes: str, separated_ms: int, last_fault_ms: int
    ) -> None:
        row = [node, int(device_id), codes, int(separated_ms), int(last_fault_ms)]
        async with self.state.lock:
            await self.state.commit(self.state.change_sep(node, device_id, row))
            await super().put_separation(node, device_id, codes, separated_ms, last_fault_ms)

    async def delete_separation(self, node: str, device_id: int) -> None:
        async with self.state.lock:
            if (node, int(device_id)) in self.state.seps:
                await self.state.commit(self.state.change_sep(node, device_id, None))
            await super().delete_separation(node, device_id)
