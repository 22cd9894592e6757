"""ClusterD's manual-separation policy and the operator's release (reference clusterd.md §6.2
"increment + manual", §8 ``clusterd-config-cm``).

Policy (``--manual-separation-policy FILE``: the YAML of the ``manually_separate_policy.conf`` key
of ``clusterd-config-cm``; shipped defaults when absent)::

    enabled: true
    separate: {fault_window_hours: 24, fault_threshold: 3}   # 1..720 h, 1..50
    release: {fault_free_hours: 48}                          # 1..240 h, or -1 = never

Counting (a fault-center subscriber, its own :class:`faultmesh.sink.SinkWorker`): every new NPU
fault whose level is not NotHandle / SubHealth (and is not a separation itself) is held for
:data:`SOFTWARE_WINDOW_MS` (30 s). If the same code occurred on another NPU within 30 s of it, it is
a software fault and not counted; otherwise it is counted per (node, NPU, code). ``fault_threshold``
counts whose span is within ``fault_window_hours`` separate the NPU: the fault center gets a fault
of source :data:`SOURCE`, code and level ``ManuallySeparateNPU`` on that NPU (device id = the
physical id), and the separation is stored (``separations`` table of :mod:`clusterd.store`) so it
survives a restart. It is released after ``fault_free_hours`` without a counted fault on that NPU
(never with -1), or by an operator through the authenticated HTTP API (``--token-file``;
:mod:`clusterd.auth`):

- ``POST /v1/release/npu`` ``{"node": N, "device_id": PHY, "reason": WHY, "by": NAME?}`` ->
  ``{"released": [{node, device_id, code, by, released_by, release_token}]}`` (``by``: where the
  separation was held, ``clusterd`` or ``deviced``; ``released_by`` / ``release_token``: the
  operator as claimed and the verified token's name, :func:`clusterd.audit.operator_note`); 400
  without a ``reason`` (issue 31: every release says why), 404 when that NPU is not separated. An
  NPU that deviced itself separated (a ManuallySeparateNPU frequency rule, reference deviced.md
  §4.2) is released by a ``release`` control message to that deviced on the authenticated agent
  stream (503 when it is not connected): deviced's own HTTP port is not authenticated and releases
  nothing;
- ``POST /v1/release/node`` ``{"node": N, "reason": WHY, "by": NAME?}``: every separated NPU of the
  node (this policy's and deviced's) and the node's stress-test isolation (source
  ``brain:stress-test``, reference clusterd.md §4.2 step 6);
- ``GET /v1/separations``: the separated NPUs.

In Kubernetes mode (``--kube``) the ``clusterd-config-cm`` ConfigMap (namespace
``--kube-clusterd-config-namespace``, default cluster-system) is watched too: each change of its
``manually_separate_policy.conf`` key goes through the same validation (:meth:`set_policy_text`).

The CLI is ``faultmesh release npu NODE/PHY`` / ``faultmesh release node NODE``. Disabling the
policy resets the counters and the pending window (separations stay until released). A policy file
is re-checked every tick; a bad one is rejected with the file, the key and why (logged ``manual
separation policy rejected``, counted in ``faultmesh_config_rejected_total{file}``) and the last
good policy stays.

faultmesh differences: the 30 s software-fault window spans the cluster (the reference's spans one
job); the separation state lives in the state file, not in ``clusterd-manual-info-cm``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import yaml
from aiohttp import web
from prometheus_client import Counter, Gauge

from clusterd.audit import operator_note, operator_row, record
from clusterd.brain.component import ISOLATE_SOURCE
from clusterd.breaker import IsolationBreaker
from clusterd.center import OCCUR
from clusterd.context import ClusterContext
from clusterd.separationpolicy import MAX_POLICY_BYTES, Policy, PolicyError, on_another_npu
from faultmesh._pb import agent_pb2
from faultmesh.files import FileWatch
from faultmesh.httpd import json_response
from faultmesh.log import event
from faultmesh.model import Change, Fault, now_ms

log = logging.getLogger("clusterd.separation")

SOURCE = "clusterd:manual-separation"
CODE = LEVEL = "ManuallySeparateNPU"
SOFTWARE_WINDOW_MS = 30_000
NOT_COUNTED = frozenset({"NotHandleFault", "SubHealthFault", "NotHandle"})
HOUR_MS = 3_600_000


class AgentUnavailable(RuntimeError):
    """The node's deviced, which holds the NPU's own separation, is not connected."""


@dataclass
class Separation:
    """One separated NPU: ``codes`` that got it there, when (ms), the last counted fault (ms)."""

    node: str
    device_id: int
    codes: set[str] = field(default_factory=set)
    separated_ms: int = 0
    last_fault_ms: int = 0
    why: dict[str, str] = field(default_factory=dict)  # upgrade_rule / upgrade_occurrences_ms

    def fault(self) -> Fault:
        """The fault-center record of this separation."""
        return Fault(
            source=SOURCE,
            node=self.node,
            device_type="NPU",
            device_id=self.device_id,
            code=CODE,
            level=LEVEL,
            first_seen_ms=self.separated_ms,
            last_seen_ms=self.separated_ms,
            attributes={"codes": ",".join(sorted(self.codes)), "manually_separated": "true", **self.why},
        )


@dataclass(frozen=True)
class SeparationConfig:
    """Manual separation's configuration section (:func:`faultmesh.config.section`):
    ``manual_separation_policy`` ``--manual-separation-policy`` (a YAML file; None: the default
    policy), ``manual_separation_check_s`` ``--manual-separation-check-s`` (s between ticks)."""

    manual_separation_policy: str | None
    manual_separation_check_s: float


def _operator(row: dict[str, Any], note: dict[str, str]) -> dict[str, Any]:
    """A released row of the HTTP answer with the operator who released it (claimed and verified)."""
    return row | {"released_by": note["released_by"], "release_token": note["release_token"]}


class ManualSeparation:
    """The policy as a ClusterD component (module docstring), built with its
    :class:`SeparationConfig`. ``clock`` (ms) is injectable; tests call :meth:`tick` directly."""

    name = "manual-separation"

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--manual-separation-policy",
            help="YAML of clusterd-config-cm's manually_separate_policy.conf (default: enabled, 24 h, 3, 48 h); "
            "re-read when it changes",
        )
        parser.add_argument(
            "--manual-separation-check-s",
            type=float,
            default=15.0,
            help="s between policy ticks (reference 15)",
        )

    def __init__(
        self,
        ctx: ClusterContext,
        cfg: SeparationConfig,
        breaker: IsolationBreaker | None = None,
        clock=now_ms,
    ) -> None:
        """``breaker``: asked before an NPU's node is newly isolated (:mod:`clusterd.breaker`)."""
        self.ctx = ctx
        self.breaker = breaker
        self.clock = clock
        self.path = cfg.manual_separation_policy
        self.check_s = cfg.manual_separation_check_s
        self.policy = Policy()
        self._watch = FileWatch(self.path) if self.path else None
        self.separated: dict[tuple[str, int], Separation] = {}
        self.seen: list[tuple[int, str, int, str, bool]] = []  # (t, node, dev, code, decided)
        self.counts: dict[tuple[str, int, str], list[int]] = collections.defaultdict(list)
        self.stats: collections.Counter[str] = collections.Counter()
        reg = ctx.metrics.registry
        self.rejected = Counter(
            "faultmesh_config_rejected",
            "Rejected config files (the last good one stays)",
            ["file"],
            registry=reg,
        )
        self.gauge = Gauge("faultmesh_manually_separated_npus", "NPUs manually separated", registry=reg)
        self.gauge.set_function(lambda: len(self.separated))

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        """Load the policy and the stored separations, re-assert their faults, subscribe, tick."""
        self.reload_policy()
        for node, dev, codes, sep_ms, last_ms in await self.ctx.store.load_separations():
            self.separated[(node, dev)] = Separation(
                node, dev, set(filter(None, codes.split(","))), sep_ms, last_ms
            )
        restored = {f.key: f for f in self.ctx.center.faults_of_origin(SOURCE)}
        for s in self.separated.values():  # the rule and occurrences that separated it (not in the table)
            old = restored.get(s.fault().key)
            s.why = {k: v for k, v in old.attributes.items() if k.startswith("upgrade_")} if old else {}
        keep = {s.fault().key for s in self.separated.values()}
        stale = [k for k in restored if k not in keep]
        await self.ctx.center.apply([s.fault() for s in self.separated.values()], stale, SOURCE)
        self.ctx.center.subscribe(self.name, self.on_changes, maxsize=1024)
        self.ctx.tasks.spawn(self._loop(), name="manual-separation")

    async def stop(self) -> None:
        """Nothing to flush: every separation is stored when it happens."""

    def add_routes(self, router: web.UrlDispatcher) -> None:
        """``POST /v1/release/npu``, ``POST /v1/release/node``, ``GET /v1/separations``."""
        router.add_post("/v1/release/npu", self._http_release_npu)
        router.add_post("/v1/release/node", self._http_release_node)
        router.add_get("/v1/separations", self._http_list)

    def reload_policy(self) -> bool:
        """Re-read the policy file when it changed; a bad one is rejected (the last good stays).
        Returns True when a new policy is in force."""
        if self._watch is None or not self._watch.changed():
            return False
        return self._adopt(lambda: Policy.load(self.path), Path(self.path).name)

    def set_policy_text(self, text: str | None, name: str = "clusterd-config-cm") -> bool:
        """Adopt a policy given as YAML text (Kubernetes mode: the ``manually_separate_policy.conf``
        key of ``clusterd-config-cm``); a bad or missing one is rejected, the last good stays."""

        def parse() -> Policy:
            if text is None:
                raise PolicyError(f"{name}: no key manually_separate_policy.conf")
            if len(text) > MAX_POLICY_BYTES:
                raise PolicyError(f"{name}: larger than {MAX_POLICY_BYTES} bytes")
            try:
                return Policy.from_obj(yaml.safe_load(text), name)
            except yaml.YAMLError as e:
                raise PolicyError(f"{name}: not YAML: {e}") from None

        return self._adopt(parse, name)

    def _adopt(self, parse, name: str) -> bool:
        try:
            new = parse()
        except PolicyError as e:
            self.rejected.labels(name).inc()
            event(
                log, logging.ERROR, "manual separation policy rejected", error=str(e), kept=str(self.policy)
            )
            return False
        if not new.enabled and self.policy.enabled:
            self.seen.clear()
            self.counts.clear()
        self.policy = new
        event(log, logging.INFO, "manual separation policy loaded", source=name, policy=str(new))
        return True

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.check_s)
            try:
                self.reload_policy()
                await self.tick()
            except Exception as e:  # one bad tick must not end the loop
                event(log, logging.ERROR, "manual separation tick failed", error=repr(e))

    # -- counting -------------------------------------------------------------------------------
    async def on_changes(self, changes: list[Change]) -> None:
        """The fault-center subscriber: note each new countable NPU fault (module docstring)."""
        now = self.clock()
        for ch in changes:
            f = ch.fault
            if ch.kind != OCCUR or f.device_type != "NPU" or f.source == SOURCE:
                continue
            if f.level in NOT_COUNTED or f.code == CODE or not self.policy.enabled:
                continue
            self.seen.append((now, f.node, f.device_id, f.code, False))
            sep = self.separated.get((f.node, f.device_id))
            if sep is not None:
                sep.last_fault_ms = now

    async def tick(self) -> None:
        """Decide the faults whose 30 s window closed, separate, and release expired separations."""
        now = self.clock()
        decided = []
        due = [i for i, e in enumerate(self.seen) if not e[4] and e[0] <= now - SOFTWARE_WINDOW_MS]
        on_other = on_another_npu(self.seen, [self.seen[i] for i in due], SOFTWARE_WINDOW_MS) if due else []
        for i, software in zip(due, on_other, strict=True):
            t, node, dev, code, _ = self.seen[i]
            self.seen[i] = (t, node, dev, code, True)
            if software:
                self.stats["software"] += 1
                continue
            decided.append((t, node, dev, code))
        self.seen = [e for e in self.seen if e[0] > now - 2 * SOFTWARE_WINDOW_MS or not e[4]]
        window = self.policy.window_hours * HOUR_MS
        for t, node, dev, code in decided:
            times = self.counts[(node, dev, code)]
            times.append(t)
            times[:] = [x for x in times if x >= now - window]
            self.stats["counted"] += 1
            n = self.policy.threshold
            if len(times) >= n and times[-1] - times[-n] < window:
                if self.breaker is not None and not self.breaker.admit(node, "separation"):
                    continue  # held: the count stays, the next occurrence asks again
                del self.counts[(node, dev, code)]
                await self.separate(node, dev, code, now, times[-n:])
        if self.policy.free_hours != -1:
            free = self.policy.free_hours * HOUR_MS
            for (node, dev), s in list(self.separated.items()):
                if now - max(s.separated_ms, s.last_fault_ms) > free:
                    await self.release_npu(node, dev, by="fault-free")

    async def separate(
        self, node: str, dev: int, code: str, now: int | None = None, times: list[int] | None = None
    ) -> Separation:
        """Separate NPU ``dev`` (physical id) of ``node`` for ``code``; stored, then in the fault center.
        ``times`` (ms): the counted occurrences that did it, kept with the rule in the fault's
        ``upgrade_rule`` / ``upgrade_occurrences_ms`` attributes (as deviced's rules name theirs: the
        history's WHY, issue 31)."""
        now = self.clock() if now is None else now
        s = self.separated.get((node, dev))
        if s is None:
            s = self.separated[(node, dev)] = Separation(node, dev, set(), now, now)
        s.codes.add(code)
        p = self.policy
        s.why = {
            "upgrade_rule": f"manual separation policy: {code} {p.threshold} times in {p.window_hours} h -> {LEVEL}",
            "upgrade_occurrences_ms": ",".join(str(t) for t in times or ()),
        }
        await self.ctx.store.put_separation(
            node, dev, ",".join(sorted(s.codes)), s.separated_ms, s.last_fault_ms
        )
        await self.ctx.center.upsert(s.fault(), origin=SOURCE)
        self.stats["separated"] += 1
        event(log, logging.WARNING, "npu manually separated", node=node, device_id=dev, code=code,
              threshold=self.policy.threshold, window_hours=self.policy.window_hours)  # fmt: skip
        return s

    # -- release --------------------------------------------------------------------------------
    async def release_npu(
        self, node: str, dev: int, by: str = "operator", note: dict[str, str] | None = None
    ) -> list[str]:
        """Release NPU ``dev`` (physical id) of ``node``. Returns who released it: ``clusterd`` (this
        policy's separation) and, for an operator, ``deviced`` when the node's deviced holds its own
        ManuallySeparateNPU escalation (frequency rule) and the release was sent to it on the agent
        stream. ``note`` (:func:`clusterd.audit.operator_note`: who, from where, why) goes into the history's recover
        row and the log line. Raises :class:`AgentUnavailable` when that deviced is not connected."""
        out = []
        s = self.separated.pop((node, dev), None)
        if s is not None:
            for key in [k for k in self.counts if k[:2] == (node, dev)]:
                del self.counts[key]
            await self.ctx.store.delete_separation(node, dev)
            await self.ctx.center.apply([], [s.fault().key], SOURCE, note=note)
            self.stats[f"released_{by}"] += 1
            out.append("clusterd")
        held = [
            f
            for f in self.ctx.center.faults_of_node(node)
            if f.device_type == "NPU" and f.device_id == dev and f.level == LEVEL and f.source != SOURCE
        ]
        if by == "operator" and held:  # what deviced held when the operator saw it (proto ReleaseDevice)
            msg = agent_pb2.ReleaseDevice(phy_id=dev, seen_until_ms=max(f.last_seen_ms for f in held))
            if not await self.ctx.agents.send(node, "deviced", release=msg):
                raise AgentUnavailable(f"deviced on {node} is not connected: its ManuallySeparateNPU stays")
            out.append("deviced")
            if note:  # deviced's own recover carries no note: who and why get a history row here
                await record(self.ctx.store, "release", [operator_row(node, "NPU", dev, CODE, LEVEL, note)])
        if out:
            event(
                log,
                logging.INFO,
                "npu separation released",
                node=node,
                device_id=dev,
                by=by,
                at=",".join(out),
                **(note or {}),
            )
        return out

    async def release_node(
        self, node: str, by: str = "operator", note: dict[str, str] | None = None
    ) -> list[dict[str, Any]]:
        """Release every separated NPU of ``node`` (this policy's and deviced's) and its stress-test
        isolation; returns what was released (``note``: as :meth:`release_npu`)."""
        devs = {k[1] for k in self.separated if k[0] == node}
        devs |= {
            f.device_id
            for f in self.ctx.center.faults_of_node(node)
            if f.device_type == "NPU" and f.level == LEVEL
        }
        out: list[dict[str, Any]] = []
        for dev in sorted(devs):
            for who in await self.release_npu(node, dev, by, note):
                out.append({"node": node, "device_id": dev, "code": CODE, "by": who})
        iso = [f.key for f in self.ctx.center.faults_of_node(node) if f.source == ISOLATE_SOURCE]
        if iso:
            await self.ctx.center.apply([], iso, ISOLATE_SOURCE, note=note)
            out += [{"node": node, "device_id": k.device_id, "code": k.code, "by": "clusterd"} for k in iso]
            event(
                log,
                logging.INFO,
                "node isolation released",
                node=node,
                by=by,
                faults=len(iso),
                **(note or {}),
            )
        return out

    # -- HTTP -----------------------------------------------------------------------------------
    async def _body(self, request: web.Request) -> dict[str, Any]:
        """The release body ``{"node": str, ...}``; 400 when it is not JSON or has no node. Decoded
        with orjson as the other JSON endpoints (aiohttp's ``request.json`` is the stdlib decoder,
        whose RecursionError on 100k nested ``[`` answered 500 with a traceback)."""
        try:
            body = orjson.loads(await request.read())
        except ValueError:
            raise web.HTTPBadRequest(
                text='{"error": "body must be JSON"}', content_type="application/json"
            ) from None
        if not isinstance(body, dict) or not isinstance(body.get("node"), str) or not body["node"]:
            raise web.HTTPBadRequest(
                text='{"error": "node (string) required"}', content_type="application/json"
            )
        return body

    async def _http_release_npu(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        dev = body.get("device_id")
        if isinstance(dev, bool) or not isinstance(dev, int) or dev < 0:
            return json_response({"error": "device_id (physical id, integer >= 0) required"}, status=400)
        note = operator_note(request, body, self.ctx.auth.token_name, reason_required=True)
        try:
            who = await self.release_npu(body["node"], dev, note=note)
        except AgentUnavailable as e:
            return json_response({"error": str(e)}, status=503)
        if not who:
            return json_response({"error": f"NPU {body['node']}/{dev} is not manually separated"}, status=404)
        return json_response(
            {
                "released": [
                    _operator({"node": body["node"], "device_id": dev, "code": CODE, "by": w}, note)
                    for w in who
                ]
            }
        )

    async def _http_release_node(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        note = operator_note(request, body, self.ctx.auth.token_name, reason_required=True)
        try:
            released = await self.release_node(body["node"], note=note)
        except AgentUnavailable as e:
            return json_response({"error": str(e)}, status=503)
        if not released:
            return json_response(
                {"error": f"node {body['node']} has nothing separated or isolated"}, status=404
            )
        return json_response({"released": [_operator(r, note) for r in released]})

    async def _http_list(self, _request: web.Request) -> web.Response:
        return json_response(
            [
                {"node": s.node, "device_id": s.device_id, "codes": sorted(s.codes),
                 "separated_ms": s.separated_ms, "last_fault_ms": s.last_fault_ms}
                for s in sorted(self.separated.values(), key=lambda s: (s.node, s.device_id))
            ]
        )  # fmt: skip
