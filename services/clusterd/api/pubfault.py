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
answers 0, a request that would go over either cap is refused whole before anything is applied:
409 ``check public fault info failed, error: public fault cache full: ...``. Faults go to the fault center (source ``public:<resource>:<faultId>``, one record per
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
import logging
import re
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from clusterd.center import StoreWriteError
from faultmesh._pb import pubfault_pb2, pubfault_pb2_grpc
from faultmesh.config import positive_float
from faultmesh.faultrules import unknown_key
from faultmesh.files import FileWatch
from faultmesh.log import RateLimitedLog, event
from faultmesh.model import ONCE, RECOVER, Fault, FaultKey, now_ms
from faultmesh.ratelimit import TokenBucket

if TYPE_CHECKING:
    from clusterd.context import ClusterContext

log = logging.getLogger("clusterd.pubfault")

DEFAULT_TABLE = Path(__file__).parent.parent / "tables" / "publicFaultConfiguration.json"
ID_RE = re.compile(r"^[a-zA-Z0-9\-_.]{8,128}$")
DESC_RE = re.compile(r"^[\S ]{0,512}$")
NODE_RE = re.compile(r"^[a-z0-9]([a-z0-9\-.]{0,251}[a-z0-9])?$")
MIN_TIME_MS = 1735689600000  # 2025-01-01T00:00:00Z
FAULT_TYPES = ("NPU", "Node", "Network", "Storage")
ASSERTIONS = ("occur", "recover", "once")
MAX_ITEMS = 50_000  # reference cache cap: one item per (node, resource + faultId)
MAX_RECORDS = 50_000  # faultmesh: one record per device id; bounded too (memory, event-loop time)
DELETE_DELAY_MS = 5_000
SUCCESS = (0, "public fault send successfully")
SERVER_INNER_ERROR = 599  # reference code ServerInnerError: the state write failed, nothing applied
LEVEL_KEYS = (  # lookup precedence: Separate > PreSeparate > SubHealth > NotHandle
    ("SeparateNPUCodes", "SeparateNPU"),
    ("PreSeparateNPUCodes", "PreSeparateNPU"),
    ("SubHealthFaultCodes", "SubHealthFault"),
    ("NotHandleFaultCodes", "NotHandleFault"),
)


class TableError(ValueError):
    """A public fault table that cannot be used (the message says why)."""


MAX_TABLE_BYTES = 4 * 1024 * 1024  # as deviced's and noded's tables; the reference's default is < 1 KiB
TOP_KEYS = ("publicFaultCode", "publicFaultResource")
CODE_RE = re.compile(r"^[0-9]{9}$")  # reference §5: 9 digits (type, level, "00", origin, number)


def _check_keys(obj: dict, known: tuple[str, ...], where: str) -> None:
    """Refuse a table with a key outside ``known`` (:func:`faultmesh.faultrules.unknown_key`)."""
    if bad := unknown_key(obj, known, where):
        raise TableError(bad)


class PublicFaultTable:
    """The public fault table in the reference's publicFaultConfiguration.json format
    (clusterd.md §5 "Configuration").

    ``levels``: code -> level name; ``resources``: allowed senders. A key outside the reference's
    schema (top level ``publicFaultCode`` / ``publicFaultResource``; level lists
    ``NotHandleFaultCodes``, ``SubHealthFaultCodes``, ``SeparateNPUCodes``, ``PreSeparateNPUCodes``),
    a level list that is not a list (null is empty), a code that is not 9 digits or an empty resource
    refuses the whole table: raises :class:`TableError` naming the key and why.
    """

    def __init__(self, data: dict[str, Any], where: str = "<table>") -> None:
        if not isinstance(data, dict):
            raise TableError(f"{where}: table must be a JSON object")
        _check_keys(data, TOP_KEYS, where)
        codes = data.get("publicFaultCode")
        resources = data.get("publicFaultResource")
        if not isinstance(codes, dict) or not isinstance(resources, list):
            raise TableError(f"{where}: publicFaultCode (object) and publicFaultResource (list) are required")
        _check_keys(codes, tuple(k for k, _ in LEVEL_KEYS), f"{where}: publicFaultCode")
        self.levels: dict[str, str] = {}
        for key, level in reversed(LEVEL_KEYS):  # later (more severe) lists win
            items = codes.get(key)
            if items is None:
                items = []
            if not isinstance(items, list):
                raise TableError(f"{where}: {key} must be a list of code strings, not {type(items).__name__}")
            for c in items:
                if not isinstance(c, str) or not CODE_RE.match(c):
                    raise TableError(f"{where}: {key}: fault code {str(c)[:32]!r} is not 9 digits")
                self.levels[c] = level
        if not all(isinstance(r, str) and r for r in resources):
            raise TableError(f"{where}: publicFaultResource must hold non-empty strings")
        self.resources: tuple[str, ...] = tuple(dict.fromkeys(resources))

    @classmethod
    def load(cls, path: str | Path) -> PublicFaultTable:
        """Read and validate a table file. Raises :class:`TableError` (or ``OSError``)."""
        size = Path(path).stat().st_size
        if size > MAX_TABLE_BYTES:
            raise TableError(f"{path}: {size} bytes, larger than {MAX_TABLE_BYTES}")
        try:
            return cls(orjson.loads(Path(path).read_bytes()), str(path))
        except orjson.JSONDecodeError as e:
            raise TableError(f"{path}: not JSON: {e}") from e


class RequestInvalid(ValueError):
    """A request-level validation failure (code 409)."""


def _time_ok(ms: int) -> bool:
    return len(str(ms)) == 13 and ms >= MIN_TIME_MS


def validate_request(req: pubfault_pb2.PublicFaultRequest, table: PublicFaultTable) -> None:
    """Request-level rules of §5 step 2. Raises :class:`RequestInvalid` with the reason."""
    if not ID_RE.match(req.id):
        raise RequestInvalid(f"id {req.id[:140]!r} does not match {ID_RE.pattern}")
    if not _time_ok(req.timestamp):
        raise RequestInvalid(f"timestamp {req.timestamp} is not 13 digits of ms since 2025-01-01")
    if req.version != "1.0":
        raise RequestInvalid(f"version {req.version[:16]!r} is not 1.0")
    if req.resource not in table.resources:
        raise RequestInvalid(f"resource {req.resource[:64]!r} is not allowed")
    if not 1 <= len(req.faults) <= 100:
        raise RequestInvalid(f"faults must hold 1..100 items, got {len(req.faults)}")


def validate_fault(
    f: pubfault_pb2.Fault, table: PublicFaultTable, sn_to_node: dict[str, str]
) -> list[tuple[str, list[int]]]:
    """Fault-level rules of §5 step 3. Returns [(node, device_ids)]. Raises ``ValueError`` with the reason."""
    if not ID_RE.match(f.faultId):
        raise ValueError("faultId is invalid")
    if f.faultType not in FAULT_TYPES:
        raise ValueError(f"faultType {f.faultType[:32]!r} is invalid")
    if len(f.faultCode) != 9 or f.faultCode not in table.levels:
        raise ValueError(f"faultCode {f.faultCode[:32]!r} is not in the public fault table")
    if not _time_ok(f.faultTime):
        raise ValueError(f"faultTime {f.faultTime} is invalid")
    if f.assertion not in ASSERTIONS:
        raise ValueError(f"assertion {f.assertion[:32]!r} is invalid")
    if len(f.faultLocation) > 10 or any(len(k) > 16 or len(v) > 128 for k, v in f.faultLocation.items()):
        raise ValueError("faultLocation has too many or too long entries")
    if not DESC_RE.match(f.description):
        raise ValueError("description is too long or has control characters")
    if not 1 <= len(f.influence) <= 1000:
        raise ValueError(f"influence must hold 1..1000 entries, got {len(f.influence)}")
    out = []
    for inf in f.influence:
        node = inf.nodeName
        if node:
            if not NODE_RE.match(node):
                raise ValueError(f"nodeName {node[:64]!r} is invalid")
        else:
            node = sn_to_node.get(inf.nodeSN, "")
            if not inf.nodeSN or not node:
                raise ValueError(f"nodeSN {inf.nodeSN[:64]!r} resolves to no node")
        ids = list(inf.deviceIds)
        if not 1 <= len(ids) <= 32 or len(set(ids)) != len(ids) or any(not 0 <= d <= 31 for d in ids):
            raise ValueError("deviceIds must hold 1..32 distinct ids in [0, 31]")
        out.append((node, ids))
    return out


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

    def __init__(self, ctx: ClusterContext) -> None:
        self.ctx = ctx
        a = ctx.config
        self.path = Path(a.public_fault_config) if a.public_fault_config else DEFAULT_TABLE
        self.table = PublicFaultTable.load(self.path)
        self._watch = FileWatch(self.path)
        self._watch.changed()  # the table just loaded is the baseline
        self._bucket_args = (a.public_fault_qps, a.public_fault_burst)
        self._buckets = {r: TokenBucket(*self._bucket_args) for r in self.table.resources}
        self._pending_recover: dict[
            tuple[str, str, str], float
        ] = {}  # (node, resource, faultId) -> deadline s
        self._ratelog = RateLimitedLog(log)
        self._reserved = (0, 0)  # (items, records) of requests being applied: counted against the caps
        self.delete_delay_ms = int(getattr(a, "public_fault_delete_delay_s", DELETE_DELAY_MS / 1000) * 1000)
        self.max_items = getattr(a, "public_fault_max_items", MAX_ITEMS)

    def servicers(self) -> list[tuple[Any, Any]]:
        """(add_to_server, servicer) pairs this component serves."""
        return [(pubfault_pb2_grpc.add_PubFaultServicer_to_server, self)]

    async def start(self) -> None:
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
        over, reserve = self._over_cap(request.resource, accepted)
        if over:
            return self._reject("cache_full", 409, f"check public fault info failed, error: {over}")
        r = self._reserved
        self._reserved = (r[0] + reserve[0], r[1] + reserve[1])
        try:
            await self._apply(request.resource, accepted)
        except StoreWriteError as e:  # nothing was applied: the sender must retry (never answered 0)
            return self._reject("store_error", SERVER_INNER_ERROR, str(e))
        finally:
            r = self._reserved
            self._reserved = (r[0] - reserve[0], r[1] - reserve[1])
        return pubfault_pb2.RespStatus(code=SUCCESS[0], info=SUCCESS[1])

    def _over_cap(self, resource: str, accepted) -> tuple[str, tuple[int, int]]:
        """(why the request would take the public faults over a cap or "", (items, records) it may
        add: reserved while it is being applied). Counted before
        anything is applied and over public faults only (agents' faults do not use the cap).

        Items are counted as the reference counts its cache: one per (node, resource + faultId),
        i.e. per influence entry (``MAX_ITEMS``). faultmesh stores one record per device id, so the
        records are bounded too (``MAX_RECORDS``)."""
        center = self.ctx.center
        items_now = center.groups_of_origin("public") + self._reserved[0]
        records_now = center.count_of_origin("public") + self._reserved[1]
        adds = [(f, t) for f, t in accepted if f.assertion != RECOVER]
        most_items = sum(len(t) for _, t in adds)
        most_records = sum(len(ids) for _, t in adds for _, ids in t)
        if items_now + most_items <= self.max_items and records_now + most_records <= MAX_RECORDS:
            return "", (most_items, most_records)  # cannot exceed: no need to count exactly
        groups: set[tuple[str, str]] = set()
        records: set[FaultKey] = set()
        for f, targets in adds:
            source = f"public:{resource}:{f.faultId}"
            for node, ids in targets:
                if not center.has_group("public", node, source):
                    groups.add((node, source))
                records.update(
                    k
                    for k in (FaultKey(node, f.faultType, d, f.faultCode, source) for d in ids)
                    if center.get(k) is None
                )
        if items_now + len(groups) > self.max_items:
            why = (
                f"public fault cache full: the request adds {len(groups)} items to {items_now}, "
                f"limit {self.max_items} (one item per influence entry); nothing was applied"
            )
            return why, (0, 0)
        if records_now + len(records) > MAX_RECORDS:
            why = (
                f"public fault cache full: the request adds {len(records)} device faults to "
                f"{records_now}, limit {MAX_RECORDS}; nothing was applied"
            )
            return why, (0, 0)
        return "", (len(groups), len(records))

    async def _apply(self, resource: str, accepted) -> None:
        """Turn accepted faults into one atomic fault-center change (durable when this returns)."""
        center = self.ctx.center
        now = now_ms()
        upserts: list[Fault] = []
        for f, targets in accepted:
            source = f"public:{resource}:{f.faultId}"
            level = self.table.levels[f.faultCode]
            for node, ids in targets:
                keys = [FaultKey(node, f.faultType, d, f.faultCode, source) for d in ids]
                present = [center.get(k) for k in keys]
                if f.assertion == RECOVER:
                    if not any(present):
                        self._pending_recover[(node, resource, f.faultId)] = (
                            time.monotonic() + self.delete_delay_ms / 1000
                        )
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
                deadline = self._pending_recover.pop((node, resource, f.faultId), None)
                if deadline is not None:
                    attrs["expires_ms"] = str(now + max(0, int((deadline - time.monotonic()) * 1000)))
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
            await center.apply(upserts, [], "public")

    async def _sweeper(self) -> None:
        """Every 1 s: remove public faults whose delete time passed; reload the table if it changed."""
        while True:
            await asyncio.sleep(1.0)
            try:
                if self._reload_if_changed():
                    await self.relevel()
                now = now_ms()
                due = [
                    f.key
                    for f in self.ctx.center.faults_of_origin("public")
                    if 0 < int(f.attributes.get("expires_ms", "0") or 0) <= now
                ]
                if due:
                    await self.ctx.center.apply([], due, "public")
                t = time.monotonic()
                for k in [k for k, d in self._pending_recover.items() if d <= t]:
                    del self._pending_recover[k]
            except Exception as e:
                event(log, logging.ERROR, "public fault sweep failed", error=repr(e))
