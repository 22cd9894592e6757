"""PubFault: the public fault intake (``/PubFault/SendPublicFault``), reference clusterd.md §5.

Validation, in the reference's order and with its response codes:

1. per-resource token bucket (1/s, burst 100; ``--public-fault-qps/--public-fault-burst``); unknown resource or empty bucket -> 410
   ``limiter work by resource failed``;
2. request rules -> 409 ``check public fault info failed, error: <why>``: id ``^[a-zA-Z0-9-_.]{8,128}$``,
   timestamp 13 digits and >= 2025-01-01 (ms), version "1.0", known resource, 1..100 faults;
3. fault rules: an invalid fault is dropped and logged; none left -> 409 ``there is no valid fault``.
   faultId as id; faultType in NPU/Node/Network/Storage; faultCode 9 chars and in the table;
   faultTime as timestamp; assertion occur/recover/once; faultLocation <= 10 entries, key <= 16,
   value <= 128; description ``^[\\S ]{0,512}$``; influence 1..1000 entries, each with a valid
   nodeName (or a nodeSN that resolves to a node) and 1..32 distinct deviceIds in [0, 31].

Success: 0 ``public fault send successfully``, only once the change is committed; when the state
write fails nothing is applied and the answer is 599 (ServerInnerError) ``state write failed: <error>``,
so a sender's retry of the same faultId is applied and stored. Cache semantics (§5 "Cache semantics"): key =
resource + faultId per node; a repeated occur does not refresh; ``once`` and ``recover`` remove the
fault 5 s after it was added (a recover before its occur removes a later occur at now+5 s); at most
50 000 items, counted as the reference does (one per influence entry: node + resource + faultId) over
public faults only, and at most 50 000 device records (faultmesh stores one per device id; the
reference has no such bound). Unlike the reference, which drops adds over the cap silently and
answers 0, a request that would go over either cap is refused whole, nothing applied: 409 ``check
public fault info failed, error: public fault cache full: ...``; the fault center's writer judges it
on the exact state the operations before it left (:func:`clusterd.api.pubrules.over_cap`), as it
judges the agents' per-node cap, so concurrent requests cannot pass it together. A delete deadline is
stored with its fault (attribute ``expires_ms``) and kept on a heap: the sweeper removes what is due
(after a restart too) without scanning every public fault; a recover that came before its occur is
stored (namespace ``pubfault_pending``) and survives a restart. Faults go to the fault center (source ``public:<resource>:<faultId>``, one record per
device id) and so survive restarts with their first-seen time. The table file is re-read within
1 s of a change; a valid new table re-levels the active public faults (:meth:`PubFaultComponent.relevel`,
issue 20), a broken one (not JSON, an unknown key such as a misspelt ``SeperateNPUCodes``, a code
that is not 9 digits: :class:`PublicFaultTable`) is rejected with its reason, logged and counted
(``faultmesh_rejected_requests_total{service="pubfault",reason="table_rejected"}``) and the old one
kept; at start it stops clusterd with the reason (exit 1, as every file named by a flag).

Intake is one plain method, :meth:`PubFaultComponent.intake`; the gRPC servicer method
``SendPublicFault`` and Kubernetes mode (public-fault ConfigMaps) both call it. The bearer token
of the gRPC call is checked by :class:`clusterd.auth.TokenInterceptor` before it gets here.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from clusterd.api.pubrules import (  # re-exported: the table and its default are read by others
    DEFAULT_TABLE,
    MAX_ITEMS,
    CacheFull,
    PublicFaultTable,
    RequestInvalid,
    TableError,
    over_cap,
    validate_fault,
    validate_request,
)
from clusterd.center import StoreWriteError
from clusterd.faultindex import FaultIndex
from faultmesh._pb import pubfault_pb2, pubfault_pb2_grpc
from faultmesh.config import positive_float
from faultmesh.files import FileWatch
from faultmesh.log import RateLimitedLog, event
from faultmesh.model import ONCE, RECOVER, Fault, FaultKey, now_ms
from faultmesh.ratelimit import TokenBucket

if TYPE_CHECKING:
    from clusterd.context import ClusterContext

log = logging.getLogger("clusterd.pubfault")

PENDING_NS = "pubfault_pending"  # store namespace: recovers that came before their occur
DELETE_DELAY_MS = 5_000
SUCCESS = (0, "public fault send successfully")
SERVER_INNER_ERROR = 599  # reference code ServerInnerError: the state write failed, nothing applied


@dataclass(frozen=True)
class PubFaultConfig:
    """PubFault's configuration section (:func:`faultmesh.config.section`): ``public_fault_config``
    ``--public-fault-config`` (the table file; None: the shipped one), ``public_fault_qps``
    ``--public-fault-qps`` and ``public_fault_burst`` ``--public-fault-burst`` (the per-resource
    token bucket), ``public_fault_delete_delay_s`` ``--public-fault-delete-delay-s`` (s),
    ``public_fault_max_items`` ``--public-fault-max-items``."""

    public_fault_config: str | None
    public_fault_qps: float
    public_fault_burst: float
    public_fault_delete_delay_s: float
    public_fault_max_items: int


class PubFaultComponent(pubfault_pb2_grpc.PubFaultServicer):
    """The PubFault service inside ClusterD (see the module docstring)."""

    name = "pubfault"

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--public-fault-config",
            default=None,
            help="public fault table (publicFaultConfiguration.json format); "
            "default: the table shipped with faultmesh; reloaded when it changes",
        )
        parser.add_argument(
            "--public-fault-qps",
            type=positive_float,
            default=1.0,
            help="per-resource token bucket refill (req/s); the reference uses 1",
        )
        parser.add_argument(
            "--public-fault-delete-delay-s",
            type=float,
            default=DELETE_DELAY_MS / 1000,
            help="a once / recovered public fault is removed this long after it was added (s); the reference uses 5",
        )
        parser.add_argument(
            "--public-fault-max-items",
            type=int,
            default=MAX_ITEMS,
            help="faults in the fault center beyond which new public faults are dropped; the reference uses 50000",
        )
        parser.add_argument(
            "--public-fault-burst",
            type=float,
            default=100.0,
            help="per-resource token bucket size; the reference uses 100",
        )

    def __init__(self, ctx: ClusterContext, a: PubFaultConfig) -> None:
        self.ctx = ctx
        self.path = Path(a.public_fault_config) if a.public_fault_config else DEFAULT_TABLE
        self.table = PublicFaultTable.load(self.path)
        self._watch = FileWatch(self.path)
        self._watch.changed()  # the table just loaded is the baseline
        self._bucket_args = (a.public_fault_qps, a.public_fault_burst)
        self._buckets = {r: TokenBucket(*self._bucket_args) for r in self.table.resources}
        # a recover before its occur: (node, resource, faultId) -> deadline (ms since the epoch);
        # stored (namespace PENDING_NS), so it survives a restart
        self._pending_recover: dict[tuple[str, str, str], int] = {}
        self._expiry: list[tuple[int, FaultKey]] = []  # heap of (expires_ms, key) of public faults
        self._ratelog = RateLimitedLog(log)
        self.delete_delay_ms = int(a.public_fault_delete_delay_s * 1000)
        self.max_items = a.public_fault_max_items

    def servicers(self) -> list[tuple[Any, Any]]:
        """(add_to_server, servicer) pairs this component serves."""
        return [(pubfault_pb2_grpc.add_PubFaultServicer_to_server, self)]

    async def start(self) -> None:
        """Restore the pending recovers and the delete deadlines, start the sweeper."""
        for key, deadline in (await self.ctx.store.kv_items(PENDING_NS)).items():
            parts = key.split("\t")
            if len(parts) == 3 and isinstance(deadline, int):
                self._pending_recover[(parts[0], parts[1], parts[2])] = deadline
        self._watch_expiry(self.ctx.center.faults_of_origin("public"))
        self.ctx.tasks.spawn(self._sweeper(), name="pubfault-sweeper")

    async def stop(self) -> None:
        pass

    def _reload_if_changed(self) -> bool:
        """Adopt the table file when it changed and is valid. True when a new table was taken."""
        if not self._watch.changed():
            return False
        try:
            table = PublicFaultTable.load(self.path)
        except (TableError, OSError) as e:
            self.ctx.metrics.reject("pubfault", "table_rejected")
            event(
                log,
                logging.ERROR,
                "public fault table rejected, keeping the old one",
                path=self.path,
                error=e,
            )
            return False
        self.table = table
        self._buckets = {r: self._buckets.get(r) or TokenBucket(*self._bucket_args) for r in table.resources}
        event(log, logging.INFO, "public fault table reloaded", path=self.path, codes=len(table.levels))
        return True

    async def relevel(self) -> int:
        """Re-level the active public faults to the current table (issue 20): each fault whose code
        now has another level is updated (one ``update`` change, logged "fault level updated"); a
        code the table no longer lists keeps its level (logged once per code). Returns the count."""
        ups, unlisted = [], set()
        for f in self.ctx.center.faults_of_origin("public"):
            level = self.table.levels.get(f.code)
            if level is None:
                unlisted.add(f.code)
            elif level != f.level:
                event(
                    log,
                    logging.INFO,
                    "fault level updated",
                    node=f.node,
                    code=f.code,
                    faultId=f.attributes.get("faultId", ""),
                    old_level=f.level,
                    new_level=level,
                )
                ups.append(replace(f, level=level))
        for code in sorted(unlisted):
            event(log, logging.WARNING, "public fault code not in the new table, level kept", code=code)
        if ups:
            await self.ctx.center.apply(ups, [], "public")
        return len(ups)

    def _reject(self, reason: str, code: int, info: str, **why: str) -> pubfault_pb2.RespStatus:
        """Count, log (once a minute per reason, with ``why``'s fields) and answer ``code`` / ``info``
        (the reference's text, which clients match)."""
        self.ctx.metrics.reject("pubfault", reason)
        key = f"{reason}:{why.get('why', '')}"  # an unknown resource is not hidden behind a rate limit
        self._ratelog.warning(key, "public fault rejected", code=code, info=info, **why)
        return pubfault_pb2.RespStatus(code=code, info=info)

    async def SendPublicFault(self, request, context):  # noqa: N802
        """The gRPC method: :meth:`intake`."""
        return await self.intake(request)

    async def intake(self, request: pubfault_pb2.PublicFaultRequest) -> pubfault_pb2.RespStatus:
        """Validate and apply one public fault request (durable when this returns); see the module
        docstring for the codes of the returned status."""
        bucket = self._buckets.get(request.resource)
        if bucket is None or not bucket.take():
            why = "unknown resource" if bucket is None else "rate limit"
            resource = request.resource[:64]
            return self._reject(
                "rate_or_resource", 410, "limiter work by resource failed", resource=resource, why=why
            )
        try:
            validate_request(request, self.table)
        except RequestInvalid as e:
            return self._reject("invalid_request", 409, f"check public fault info failed, error: {e}")
        sn_to_node = self.ctx.nodes.by_sn()
        accepted = []
        for f in request.faults:
            try:
                targets = validate_fault(f, self.table, sn_to_node)
            except ValueError as e:
                self.ctx.metrics.reject("pubfault", "invalid_fault")
                self._ratelog.warning(
                    "invalid_fault", "public fault dropped", faultId=f.faultId[:128], error=e
                )
                continue
            accepted.append((f, targets))
        if not accepted:
            return self._reject("no_valid_fault", 409, "there is no valid fault")
        try:
            await self._apply(request.resource, accepted)
        except CacheFull as e:  # judged by the fault center's writer: nothing was applied
            return self._reject("cache_full", 409, f"check public fault info failed, error: {e}")
        except StoreWriteError as e:  # nothing was applied: the sender must retry (never answered 0)
            return self._reject("store_error", SERVER_INNER_ERROR, str(e))
        return pubfault_pb2.RespStatus(code=SUCCESS[0], info=SUCCESS[1])

    def _cap_guard(self, resource: str, accepted):
        """The fault-center writer's check of a request against the caps: returns
        ``guard(index)`` -> :class:`CacheFull` when the request would take the public faults over a
        cap, else None. The writer calls it on the exact state the operations before it left, so
        concurrent requests cannot pass the cap together (module docstring). Counted over public
        faults only (agents' faults do not use the cap).

        Items are counted as the reference counts its cache: one per (node, resource + faultId),
        i.e. per influence entry (``MAX_ITEMS``). faultmesh stores one record per device id, so the
        records are bounded too (``MAX_RECORDS``)."""
        max_items = self.max_items

        def guard(index: FaultIndex) -> CacheFull | None:
            why = over_cap(index, resource, accepted, max_items)
            return CacheFull(why) if why else None

        return guard

    async def _apply(self, resource: str, accepted) -> None:
        """Turn accepted faults into one atomic fault-center change (durable when this returns)."""
        center = self.ctx.center
        now = now_ms()
        upserts: list[Fault] = []
        pending: dict[tuple[str, str, str], int] = {}  # recovers before their occur, to store
        consumed: list[tuple[str, str, str]] = []  # stored pending recovers an occur takes up
        for f, targets in accepted:
            source = f"public:{resource}:{f.faultId}"
            level = self.table.levels[f.faultCode]
            for node, ids in targets:
                keys = [FaultKey(node, f.faultType, d, f.faultCode, source) for d in ids]
                present = [center.get(k) for k in keys]
                if f.assertion == RECOVER:
                    if not any(present):
                        pending[(node, resource, f.faultId)] = now + self.delete_delay_ms
                        continue
                    ups = []
                    for p in present:
                        if p is None:
                            continue
                        due = max(now, int(p.attributes.get("added_ms", "0")) + self.delete_delay_ms)
                        ups.append(replace(p, attributes={**p.attributes, "expires_ms": str(due)}))
                    upserts.extend(ups)
                    continue
                if all(present):
                    continue  # a repeated occur does not refresh the item
                attrs = {
                    "faultId": f.faultId,
                    "resource": resource,
                    "faultTime": str(f.faultTime),
                    "description": f.description,
                    "added_ms": str(now),
                }
                if f.faultLocation:
                    attrs["faultLocation"] = orjson.dumps(
                        dict(f.faultLocation), option=orjson.OPT_SORT_KEYS
                    ).decode()
                if f.assertion == ONCE:
                    attrs["expires_ms"] = str(now + self.delete_delay_ms)
                key3 = (node, resource, f.faultId)
                deadline = pending.pop(key3, None)  # a recover earlier in this same request
                if deadline is None and (deadline := self._pending_recover.get(key3)) is not None:
                    consumed.append(key3)
                if deadline is not None:
                    attrs["expires_ms"] = str(max(now, deadline))
                upserts.extend(
                    Fault(
                        source=source,
                        node=node,
                        device_type=f.faultType,
                        device_id=d,
                        code=f.faultCode,
                        level=level,
                        assertion=f.assertion,
                        first_seen_ms=f.faultTime,
                        last_seen_ms=now,
                        attributes=attrs,
                    )
                    for d, p in zip(ids, present, strict=True)
                    if p is None
                )
        if upserts:
            await center.apply(upserts, [], "public", guard=self._cap_guard(resource, accepted))
            self._watch_expiry(upserts)
        for k in consumed:
            self._pending_recover.pop(k, None)
            await self._forget_pending(k)
        for k, deadline in pending.items():  # stored, so a restart within its 5 s keeps it
            self._pending_recover[k] = deadline
            try:
                await self.ctx.store.kv_put(PENDING_NS, "\t".join(k), deadline)
            except Exception as e:  # kept in memory: only a restart before its deadline loses it
                self.ctx.metrics.reject("pubfault", "pending_not_stored")
                event(log, logging.ERROR, "pending public recover not stored", key="/".join(k), error=repr(e))

    async def _forget_pending(self, key: tuple[str, str, str]) -> None:
        """Drop a stored pending recover (a failure is logged: it expires at the next start)."""
        try:
            await self.ctx.store.kv_delete(PENDING_NS, "\t".join(key))
        except Exception as e:
            event(
                log, logging.WARNING, "pending public recover not dropped", key="/".join(key), error=repr(e)
            )

    def _watch_expiry(self, faults) -> None:
        """Queue the delete deadlines (``expires_ms``) of ``faults`` for the sweeper."""
        for f in faults:
            due = int(f.attributes.get("expires_ms", "0") or 0)
            if due > 0:
                heapq.heappush(self._expiry, (due, f.key))

    async def _sweeper(self) -> None:
        """Every 1 s: reload the table if it changed; remove the public faults whose stored delete
        time passed (from the deadline heap: the cost follows the faults due, not every public
        fault); drop the pending recovers whose time passed."""
        while True:
            await asyncio.sleep(1.0)
            try:
                if self._reload_if_changed():
                    await self.relevel()
                await self.expire(now_ms())
            except Exception as e:
                event(log, logging.ERROR, "public fault sweep failed", error=repr(e))

    async def expire(self, now: int) -> int:
        """Remove the public faults whose ``expires_ms`` is at most ``now`` (ms) and forget the
        pending recovers due by then. Returns how many faults were removed. Raises
        :class:`StoreWriteError` (the deadlines stay queued: the next sweep retries)."""
        center = self.ctx.center
        due: dict[FaultKey, int] = {}
        while self._expiry and self._expiry[0][0] <= now:
            at, key = heapq.heappop(self._expiry)
            f = center.get(key)  # still there, still due (a re-added fault has its own entry)
            if f is not None and 0 < int(f.attributes.get("expires_ms", "0") or 0) <= now:
                due[key] = at
        if due:
            try:
                await center.apply([], list(due), "public")
            except Exception:
                for key, at in due.items():
                    heapq.heappush(self._expiry, (at, key))
                raise
        for k in [k for k, d in self._pending_recover.items() if d <= now]:
            del self._pending_recover[k]
            await self._forget_pending(k)
        return len(due)
