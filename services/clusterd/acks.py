"""Acknowledged faults (issue 31): an operator says "I know, I am on it" for a fault, with a reason
and an expiry, so alerts can leave it out while it is handled.

An acknowledgement is operator state, not a fault change: the fault keeps its level, stays in the
fault center and still drives recovery and the cluster-info documents. It covers the active faults
of one node with one code, on one device (``NPU-3``, ``Node``) or on every device of the node
(``device`` ""), until its deadline; it is not ended by the fault recovering (a fault that comes back
within the acknowledged time is still acknowledged, as an Alertmanager silence), only by the
deadline or an operator's removal.

- Durable: each one is stored (the store's ``kv`` namespace :data:`NS`) before it is answered, read
  back at start (those whose deadline passed while clusterd was down end at start), so a restart
  keeps them; the deadline is the stored one (ms since the epoch).
- Who and why: the body's ``by`` and required ``reason``, whether the bearer token was checked and
  the caller's address (:func:`clusterd.audit.operator_note`, keys :data:`clusterd.audit.ACK_KEYS`)
  are kept with it; every acknowledgement, removal and expiry writes one fault-history row per
  covered fault (kind ``ack`` / ``unack``, source ``operator``; ``GET /v1/events``, ``faultmesh
  history``) and one log line (``fault acknowledged``, ``fault acknowledgement ended``).
- Shown: ``GET /v1/faults`` and ``/v1/nodes/<name>`` give each covered fault an ``ack`` object
  (:meth:`AckBook.ack_of`); ``/metrics`` has ``faultmesh_fault_acknowledged{node,device_type,device,
  code} 1`` for each active fault an acknowledgement covers (the labels of ``faultmesh_active_fault``
  less ``level``, so a rule can say ``faultmesh_active_fault unless on(node,device_type,device,code)
  faultmesh_fault_acknowledged``; bounded by the active faults).

HTTP (writes need the bearer token when one is configured: :mod:`clusterd.auth`):

- ``POST /v1/acks`` ``{"node", "code", "device"?, "for_s", "reason", "by"?}`` (or ``"fault_id"``
  instead of node, code and device: every active fault of that public fault id, one acknowledgement
  per device) -> ``{"ack": {...}, "acks": [...], "faults": N}``; 400 for a missing reason, ``for_s`` not in (0, 7 days], a bad field; 404 when
  the node has no active fault with that code (on that device), naming the codes it has; 409 past
  :data:`MAX_ACKS`.
- ``POST /v1/acks/remove`` ``{"node", "code", "device"?, "reason"?, "by"?}`` (or ``"fault_id"``) ->
  ``{"removed": {...}, "all_removed": [...]}`` or 404. Without ``device`` and with no node-wide
  acknowledgement, the one per-device acknowledgement of that code on that node is removed; 409
  naming the devices when there are several.
- ``GET /v1/acks``: the acknowledgements in force, by node, code, device.

faultmesh addition: the reference (ClusterD, MindCluster) has no acknowledgement.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import orjson
from aiohttp import web

from clusterd.audit import ACK_KEYS, bad_request, operator_note, operator_row, record
from clusterd.context import ClusterContext
from clusterd.history import device_name
from clusterd.nodehealth import _esc
from faultmesh.httpd import json_response
from faultmesh.levels import level_severity
from faultmesh.log import event
from faultmesh.model import Fault, now_ms
from faultmesh.runtime import wait_for

log = logging.getLogger("clusterd.acks")

NS = "acks"
MAX_FOR_S = 7 * 86400
"""The longest acknowledgement (s): a week; a longer one would be a silence nobody remembers."""
MAX_ACKS = 1000
"""Acknowledgements in force at most (a request past it is 409)."""
MAX_WAIT_S = 60.0  # the expiry loop wakes at least this often (a deadline wakes it earlier)
RETRY_S = 5.0  # after a failed expiry (the store refused), the loop waits this long before the next try
SERIES = "faultmesh_fault_acknowledged"

AckOf = Callable[[Fault], "dict[str, Any] | None"]
"""What the views ask: the acknowledgement in force that covers a fault (:meth:`AckBook.ack_of`)."""


def no_ack(f: Fault) -> None:
    """An :data:`AckOf` for a view built without the book: nothing is acknowledged."""
    return None


@dataclass(frozen=True)
class Ack:
    """One acknowledgement: ``node``, ``code``, ``device`` (``NPU-3``, ``Node``; "" = every device
    of the node), who (``by`` as claimed, ``auth`` token|none, ``addr``), ``reason``, ``since_ms``
    and ``until_ms`` (ms since the epoch), ``token`` (the verified token's name, "" when none was
    checked or the record predates named tokens)."""

    node: str
    code: str
    device: str
    by: str
    auth: str
    addr: str
    reason: str
    since_ms: int
    until_ms: int
    token: str = ""

    @property
    def key(self) -> str:
        """The store key (node, device, code)."""
        return f"{self.node}\t{self.device}\t{self.code}"

    def covers(self, f: Fault) -> bool:
        """True when ``f`` is this acknowledgement's node, code and device."""
        return (
            f.node == self.node
            and f.code.upper() == self.code.upper()
            and (not self.device or device_name(f) == self.device)
        )

    def note(self) -> dict[str, str]:
        """The history row's attributes: who, how, from where, why, until when."""
        return dict(zip(ACK_KEYS, (self.by, self.auth, self.addr, self.reason, self.token), strict=True)) | {
            "ack_until_ms": str(self.until_ms)
        }

    @classmethod
    def from_store(cls, value: Any) -> Ack:
        """Raises ``TypeError`` / ``KeyError`` for a record that is not one (``token`` may be
        missing: a record stored before named tokens)."""
        return cls(
            **{k: value[k] for k in cls.__dataclass_fields__ if k != "token"}, token=value.get("token", "")
        )


def _device_of(device: str) -> tuple[str, int]:
    """``NPU-3`` -> (NPU, 3), ``Node`` -> (Node, -1), "" -> ("", -1)."""
    kind, sep, num = device.rpartition("-")
    return (kind, int(num)) if sep and num.isdigit() else (device, -1)


class AmbiguousAck(Exception):
    """An unack without a device where the code is acknowledged on several devices of the node."""


class AckBook:
    """The acknowledgements (module docstring), as a ClusterD component. ``clock`` (ms) is
    injectable; tests may call :meth:`expire` directly."""

    name = "acks"

    def __init__(self, ctx: ClusterContext, clock=now_ms) -> None:
        self.ctx = ctx
        self.clock = clock
        self._acks: dict[str, Ack] = {}
        self._by_node_code: dict[tuple[str, str], list[Ack]] = {}
        self._wake = asyncio.Event()

    # -- lifecycle ------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Read the stored acknowledgements (a bad record is dropped and logged), end the expired
        ones, start the expiry loop."""
        for key, value in (await self.ctx.store.kv_items(NS)).items():
            try:
                self._put(Ack.from_store(value))
            except (TypeError, KeyError, AttributeError):
                event(log, logging.WARNING, "stored acknowledgement rejected", key=key[:200])
                await self.ctx.store.kv_delete(NS, key)
        await self.expire()
        self.ctx.tasks.spawn(self._loop(), name="acks-expiry")

    async def stop(self) -> None:
        """Nothing to flush: every acknowledgement is stored when it is made."""

    def add_routes(self, router: web.UrlDispatcher) -> None:
        """``POST /v1/acks``, ``POST /v1/acks/remove``, ``GET /v1/acks``."""
        router.add_post("/v1/acks", self._http_add)
        router.add_post("/v1/acks/remove", self._http_remove)
        router.add_get("/v1/acks", self._http_list)

    # -- the book -------------------------------------------------------------------------------------
    def _put(self, a: Ack) -> None:
        self._drop(a.key)
        self._acks[a.key] = a
        self._by_node_code.setdefault((a.node, a.code.upper()), []).append(a)

    def _drop(self, key: str) -> Ack | None:
        a = self._acks.pop(key, None)
        if a is not None:
            k = (a.node, a.code.upper())
            rest = [x for x in self._by_node_code.get(k, []) if x.key != key]
            if rest:
                self._by_node_code[k] = rest
            else:
                self._by_node_code.pop(k, None)
        return a

    def ack_of(self, f: Fault) -> dict[str, Any] | None:
        """The acknowledgement in force that covers ``f`` as a JSON object (``by``, ``auth``,
        ``addr``, ``reason``, ``since_ms``, ``until_ms``, ``device``), or None."""
        now = self.clock()
        for a in self._by_node_code.get((f.node, f.code.upper()), ()):
            if a.until_ms > now and a.covers(f):
                return asdict(a)
        return None

    def active(self) -> list[Ack]:
        """The acknowledgements in force, by node, code, device."""
        now = self.clock()
        return sorted(
            (a for a in self._acks.values() if a.until_ms > now), key=lambda a: (a.node, a.code, a.device)
        )

    def covered(self, a: Ack) -> list[Fault]:
        """The active faults ``a`` covers, one per (device, code) (the reporting sources folded)."""
        seen: dict[tuple[str, int], Fault] = {}
        for f in self.ctx.center.faults_of_node(a.node):
            if a.covers(f):
                old = seen.get((f.device_type, f.device_id))
                if old is None or level_severity(f.level) > level_severity(old.level):
                    seen[(f.device_type, f.device_id)] = f
        return [seen[k] for k in sorted(seen)]

    def _active_codes(self, node: str) -> str:
        """``its active codes: 80E18008 (NPU-1, NPU-3), 8C1F8609 (Node)`` (at most 10 codes), or
        ``it has no active fault``: what an operator can acknowledge on ``node`` instead."""
        devices: dict[str, set[str]] = {}
        for f in self.ctx.center.faults_of_node(node):
            devices.setdefault(f.code, set()).add(device_name(f))
        if not devices:
            return "it has no active fault"
        key = lambda d: (_device_of(d)[0], _device_of(d)[1])  # noqa: E731 - NPU-2 before NPU-10
        parts = [f"{c} ({', '.join(sorted(devices[c], key=key))})" for c in sorted(devices)[:10]]
        return "its active codes: " + ", ".join(parts)

    async def _history(self, kind: str, a: Ack, faults: list[Fault], extra: dict[str, str]) -> None:
        """One history row per covered fault (one for the acknowledgement itself when none is active)."""
        note = a.note() | extra
        dtype, dev = _device_of(a.device)
        rows = [operator_row(a.node, f.device_type, f.device_id, f.code, f.level, note) for f in faults]
        await record(self.ctx.store, kind, rows or [operator_row(a.node, dtype, dev, a.code, "", note)])

    async def add(self, a: Ack) -> list[Fault]:
        """Acknowledge: store, then keep ``a`` (replacing one of the same node, device and code).
        Returns the faults it covers. Raises ``LookupError`` (no active fault to acknowledge, the
        message names the node's codes) or ``OverflowError`` (past :data:`MAX_ACKS`)."""
        faults = self.covered(a)
        if not faults:
            where = f"{a.node}" + (f" {a.device}" if a.device else "")
            raise LookupError(
                f"no active fault {a.code} on {where} to acknowledge; {self._active_codes(a.node)}"
            )
        if a.key not in self._acks and len(self._acks) >= MAX_ACKS:
            raise OverflowError(f"{MAX_ACKS} acknowledgements in force already: remove or let some expire")
        await self.ctx.store.kv_put(NS, a.key, asdict(a))
        self._put(a)
        self._wake.set()
        await self._history("ack", a, faults, {})
        event(log, logging.INFO, "fault acknowledged", node=a.node, device=a.device or "*", code=a.code,
              faults=len(faults), until_ms=a.until_ms, **{k: v for k, v in a.note().items() if k in ACK_KEYS})  # fmt: skip
        return faults

    async def remove(self, key: str, ended: str, note: dict[str, str] | None = None) -> Ack | None:
        """End the acknowledgement ``key`` (``ended``: ``removed`` or ``expired``; ``note``: who
        removed it and why). Returns it, or None when there is none."""
        a = self._acks.get(key)
        if a is None:
            return None
        await self.ctx.store.kv_delete(NS, key)
        self._drop(key)
        extra = {"ack_ended": ended} | {f"ended_{k}": v for k, v in (note or {}).items()}
        await self._history("unack", a, self.covered(a), extra)
        event(log, logging.INFO, "fault acknowledgement ended", node=a.node, device=a.device or "*",
              code=a.code, ended=ended, acked_by=a.by, **{f"ended_{k}": v for k, v in (note or {}).items()})  # fmt: skip
        return a

    async def expire(self) -> int:
        """End every acknowledgement whose deadline passed. Returns how many."""
        now = self.clock()
        gone = [k for k, a in self._acks.items() if a.until_ms <= now]
        for key in gone:
            await self.remove(key, "expired")
        return len(gone)

    async def _loop(self) -> None:
        while True:
            now = self.clock()
            due = min((a.until_ms for a in self._acks.values()), default=None)
            wait = MAX_WAIT_S if due is None else min(MAX_WAIT_S, max(0.05, (due - now) / 1000))
            self._wake.clear()
            try:
                await wait_for(self._wake.wait(), wait)
            except TimeoutError:
                pass
            try:
                await self.expire()
            except Exception as e:  # a failed store write: tried again after RETRY_S (views already
                event(log, logging.ERROR, "acknowledgement expiry failed", error=repr(e))  # read it as ended)
                await asyncio.sleep(RETRY_S)

    # -- metrics --------------------------------------------------------------------------------------
    def series_text(self) -> bytes:
        """``faultmesh_fault_acknowledged`` in the Prometheus text format (module docstring)."""
        lines = set()
        for a in self.active():
            for f in self.covered(a):
                lines.add(
                    f'{SERIES}{{node="{_esc(f.node)}",device_type="{_esc(f.device_type)}",'
                    f'device="{f.device_id}",code="{_esc(f.code)}"}} 1.0\n'
                )
        head = (
            f"# HELP {SERIES} 1 for an active fault an operator acknowledged (labels of "
            f"faultmesh_active_fault less level)\n# TYPE {SERIES} gauge\n"
        )
        return (head + "".join(sorted(lines))).encode()

    # -- HTTP -----------------------------------------------------------------------------------------
    async def _targets(self, request: web.Request) -> tuple[dict[str, Any], list[tuple[str, str, str]]]:
        """The body and the (node, code, device) it names: its ``node``, ``code`` and ``device``, or
        every active fault of its ``fault_id`` (a public fault's id: attribute ``faultId``; one per
        device it was sent for). 400 when malformed, 404 for a fault id no active fault has."""
        try:
            body = orjson.loads(await request.read())
        except ValueError:
            raise bad_request("body must be JSON") from None
        if not isinstance(body, dict):
            raise bad_request("body must be a JSON object")
        by_id = "fault_id" in body
        out = []
        for key, need in (("fault_id", by_id), ("node", not by_id), ("code", not by_id), ("device", False)):
            v = body.get(key, "")
            if not isinstance(v, str) or (need and not v) or len(v) > 253 or (v and not v.isprintable()):
                raise bad_request(
                    f"{key}: a printable string of at most 253 characters" + (" is required" if need else "")
                )
            out.append(v)
        fault_id, node, code, device = out
        if not by_id:
            return body, [(node, code, device)]
        found = sorted(
            {
                (f.node, f.code, device_name(f))
                for f in self.ctx.center.faults()
                if f.attributes.get("faultId") == fault_id
            }
        )
        if not found:
            raise web.HTTPNotFound(
                text=orjson.dumps({"error": f"no active fault has the id {fault_id!r}"}).decode(),
                content_type="application/json",
            )
        return body, found

    async def _http_add(self, request: web.Request) -> web.Response:
        body, targets = await self._targets(request)
        note = operator_note(request, body, self.ctx.auth.token_name, ACK_KEYS)
        if not note.get("ack_reason"):
            raise bad_request("reason is required: say why the fault is acknowledged")
        for_s = body.get("for_s")
        if isinstance(for_s, bool) or not isinstance(for_s, int | float) or not 0 < for_s <= MAX_FOR_S:
            raise bad_request(
                f"for_s: the acknowledgement's length in seconds, more than 0 and at most {MAX_FOR_S} (7 days)"
            )
        now = self.clock()
        acks, faults = [], 0
        for node, code, device in targets:
            who = (note[k] for k in ACK_KEYS[:4])
            a = Ack(node, code, device, *who, now, now + int(for_s * 1000), token=note["ack_token"])
            try:
                faults += len(await self.add(a))
            except LookupError as e:
                return json_response({"error": str(e)}, status=404)
            except OverflowError as e:
                return json_response({"error": str(e)}, status=409)
            acks.append(asdict(a))
        return json_response({"ack": acks[0], "acks": acks, "faults": faults})

    def _in_force(self, node: str, code: str, device: str) -> str | None:
        """The key of the acknowledgement in force of (node, code in any case, device), or None.
        ``device`` "" with no node-wide acknowledgement: the one per-device acknowledgement of that
        code on that node when there is exactly one; several raise :class:`AmbiguousAck`."""
        now = self.clock()
        found = [x for x in self._by_node_code.get((node, code.upper()), ()) if x.until_ms > now]
        exact = [x for x in found if x.device == device]
        if exact:
            return exact[0].key
        if device or not found:
            return None
        if len(found) > 1:
            devices = ", ".join(sorted(x.device for x in found))
            raise AmbiguousAck(
                f"{code} on {node} is acknowledged per device ({devices}): give the device (--device NPU-3)"
            )
        return found[0].key

    async def _http_remove(self, request: web.Request) -> web.Response:
        body, targets = await self._targets(request)
        note = operator_note(request, body, self.ctx.auth.token_name, ACK_KEYS)
        ended = {k.removeprefix("ack_").removeprefix("acked_"): v for k, v in note.items()}
        removed = []
        for node, code, device in targets:
            try:
                key = self._in_force(node, code, device)
            except AmbiguousAck as e:
                return json_response({"error": str(e)}, status=409)
            a = await self.remove(key, "removed", ended) if key is not None else None
            if a is not None:
                removed.append(asdict(a))
        if not removed:
            node, code, device = targets[0]
            where = node + (f" {device}" if device else "")
            return json_response({"error": f"no acknowledgement of {code} on {where} in force"}, status=404)
        return json_response({"removed": removed[0], "all_removed": removed})

    async def _http_list(self, _request: web.Request) -> web.Response:
        return json_response([asdict(a) for a in self.active()])
