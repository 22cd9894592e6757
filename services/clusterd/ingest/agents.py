"""ClusterD side of the agent stream (design.md "Agent stream"): ingest and control.

:class:`AgentHub` serves ``faultmesh.v1.AgentStream/Connect``. Per stream: the first message must be
``Hello``; a ``Snapshot`` replaces everything that agent said about its node
(:meth:`FaultCenter.replace_origin`) except the faults of its ``pending_sources`` (not polled yet
since the agent started: kept, and shown pending in the node view, issue 20); a ``Delta`` applies upserts/removals; each is acked with its seq
after it is durable. A stream is pipelined: its next messages are read and checked while the previous
ones commit (up to ``MAX_IN_FLIGHT``), so a burst of deltas shares one store commit (issue 18); the
acks still go out in message order, each once its commit returned. Down the same stream go control messages (``send``), numbered, and acked by the
agent; each is kept until acked, and the unacked ones are queued again, first, on the agent's next
stream (:mod:`clusterd.ingest.control`). A new stream from the same (node, agent) takes over: the old one is closed and applies
nothing more, its faults stay until the new snapshot replaces them ("agent stream taken over",
reason ``reconnect`` for the same boot id, ``restart`` for another; :func:`clusterd.ingest.session.take_over`).
A stream changes only faults its agent owns: an upsert or removal of a key owned by another origin
(another agent, ``public:*``, a component) is skipped, counted as ``foreign_origin`` and named in
the ack's error; the rest of the message is applied. A stream that breaks costs
nothing: the agent's faults stay (the agent is the truth and resyncs on reconnect) and the node is
marked disconnected. Liveness (issue 20): a stream silent for ``stale_after_s`` (agents send a
heartbeat, an empty Delta, every 10 s) or ended is marked stale in the node registry (faults kept);
an agent without a stream for ``expire_after_s`` (``--agent-expire-after-s``, a day) is dropped
with its faults, and the node with its last agent (:meth:`Liveness.expire`, the hub's ``liveness``).

Sequence numbers (:func:`clusterd.ingest.agentinput.seq_error`): a Delta must carry the previous
seq + 1, a Snapshot any larger one. A gap, a replay or an out-of-order message is not applied,
counted (``reason`` ``seq_gap`` / ``seq_replay``), logged, acked with ``resync: <reason>: ...``, and
the stream is ended: the agent reconnects and resends its whole state as a snapshot.

Snapshot parts (agent.proto): a state over the receive limit comes as parts of one Snapshot, held
until the last and applied as one (:mod:`clusterd.ingest.parts`, announced in the response headers).

Unchanged resync (issue 18): a digest claim matching the stored state is acked ``DIGEST_MATCH`` and
does what its snapshot would, without the faults; any other is acked ``DIGEST_MISMATCH``
(:mod:`clusterd.ingest.resync`).

Non-fault state (Hello identity, node status, conditions, device states) goes to the
:class:`~clusterd.nodes.NodeRegistry`. The bearer token is checked before this servicer runs
(:class:`clusterd.auth.TokenInterceptor`): a refused stream is answered UNAUTHENTICATED before it
is accepted; an accepted one gets its response headers at once, before its Hello is read (issue 35).

Bad input (no Hello, a message too large, faults of another node, absurd values: the limits of
:mod:`clusterd.ingest.agentinput`; more than :data:`MAX_FAULTS_PER_MESSAGE` faults in one message,
or a node left with more than :data:`MAX_FAULTS_PER_NODE` faults of one agent, judged by the fault
center's writer) is rejected with an Ack carrying the error, counted in
``faultmesh_rejected_requests_total{service="agent",reason}``.
A valid message whose state write failed is acked with ``internal: state write failed: <error>``
and the stream is ended, so the agent reconnects and resends its whole state as a snapshot.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge

from clusterd.center import FaultCenter, ScopeFull
from clusterd.ingest.agentinput import (
    AgentInputError,
    check_fault,
    check_faults,
    check_state,
    condition_view,
    device_view,
    owned_only,
    pending_sources,
    seq_error,
)
from clusterd.ingest.control import ControlSender
from clusterd.ingest.hello import hello_refusal
from clusterd.ingest.liveness import Liveness
from clusterd.ingest.parts import SnapshotParts
from clusterd.ingest.resync import (
    apply_claim,
    claim_error,
    snapshot_counters,
    snapshot_mark,
    snapshot_views,
)
from clusterd.ingest.session import (
    END,
    MAX_IN_FLIGHT,
    AgentSession,
    Pending,
    retrieve,
    take_over,
    takeover_reason,
)
from clusterd.nodes import NodeRegistry
from faultmesh._pb import agent_pb2, agent_pb2_grpc
from faultmesh.log import RateLimitedLog, event
from faultmesh.runtime import wait_for
from faultmesh.wire import key_from_pb

log = logging.getLogger("clusterd.agents")

MAX_FAULTS_PER_MESSAGE = 100_000
# Faults one agent may hold on one node (a deviced's fault table x 16 NPUs plus its switch and
# network codes is ~13k): a Snapshot or Delta that would leave more is refused (too_many_faults).
MAX_FAULTS_PER_NODE = 65_536
# Ack.error prefix of a message that was valid but not stored (state write failed): the agent must
# not count it as acked; ClusterD then ends the stream and the agent resends all by snapshot.
INTERNAL_ERROR = "internal"
# Ack.error prefix of a message refused for its sequence number (a gap, a replay, out of order): not
# applied; ClusterD ends the stream, the agent reconnects and resends all by snapshot.
RESYNC_ERROR = "resync"


Callback = Callable[..., Awaitable[Any] | Any]


class AgentHub(agent_pb2_grpc.AgentStreamServicer):
    """The agent-stream endpoint and the registry of connected agents."""

    def __init__(
        self,
        center: FaultCenter,
        nodes: NodeRegistry,
        registry: CollectorRegistry,
        rejected: Counter,
        stale_after_s: float = 30.0,
        expire_after_s: float = 86400.0,
    ) -> None:
        self.center = center
        self.nodes = nodes
        self.sessions: dict[tuple[str, str], AgentSession] = {}
        self.liveness = Liveness(center, nodes, self.sessions, registry, stale_after_s, expire_after_s,
                                 on_stale=lambda s: self.parts.drop(s, "agent stale"))  # fmt: skip
        self._on_connect: list[Callback] = []
        self._on_ping: list[Callback] = []
        self._on_slownode: list[Callback] = []
        self._rejected = rejected
        self._ratelog = RateLimitedLog(log)
        self.control = ControlSender(self.sessions, registry, self._reject, expire_after_s)
        self._per_agent: dict[str, int] = {}  # agent kind -> live sessions
        self.connected_gauge = Gauge(
            "faultmesh_agents_connected", "Connected agent streams", ["agent"], registry=registry
        )
        self.messages = Counter(
            "faultmesh_agent_messages_total", "Agent stream messages received", ["kind"], registry=registry
        )
        self._kind_counters: dict[str | None, Any] = {}  # message kind -> its child counter
        self._snap_full, self._snap_unchanged, self._snap_mismatch = snapshot_counters(registry)
        self.parts = SnapshotParts(registry, self._reject, self._ack, self._resync)
        self.takeovers = Counter(
            "faultmesh_agent_stream_takeovers_total",
            "A newer stream for the same (node, agent) replaced a live one",
            ["reason"],
            registry=registry,
        )

    async def watch_liveness(self) -> None:
        """:meth:`Liveness.watch` of this hub's agents: stale marks and expiry, until cancelled."""
        await self.liveness.watch()

    # -- extension points --------------------------------------------------------------------
    def on_connect(self, cb: Callback) -> None:
        """``cb(node, agent)`` after an agent's snapshot is applied (push control state again)."""
        self._on_connect.append(cb)

    def on_ping_results(self, cb: Callback) -> None:
        """``cb(node, rows: list[agent_pb2.PingResult])`` for every delta carrying pingmesh rows."""
        self._on_ping.append(cb)

    def on_slownode_report(self, cb: Callback) -> None:
        """``cb(node, report: agent_pb2.SlowNodeReport)`` for each node-level slow-node result."""
        self._on_slownode.append(cb)

    def connected(self) -> list[tuple[str, str]]:
        """(node, agent) of every live stream."""
        return sorted(self.sessions)

    def agents_of(self, node: str) -> list[str]:
        """The agents of ``node`` with a live stream, sorted (cost follows the agent kinds, not the
        streams). A connect or disconnect touches the node registry (``agent_seen``), which marks
        the node changed for the scrape caches (clusterd.pieces)."""
        return [a for a in sorted(self._per_agent) if (node, a) in self.sessions]

    async def send(self, node: str, agent: str, **body: Any) -> bool:
        """Queue one control message (e.g. ``ping_list=PingList(...)``) to (node, agent)
        (:meth:`ControlSender.send`): kept until the agent acks it, re-queued on its next stream
        when this one dies first (:mod:`clusterd.ingest.control`).

        Returns False when that agent is not connected or its queue is full (it gets the state again
        through ``on_connect`` when it reconnects).
        """
        return await self.control.send(node, agent, **body)

    def node_info(self, node: str) -> dict[str, Any]:
        """What the agents last said about ``node`` besides faults: ip, sn, status, conditions, devices
        (:meth:`NodeRegistry.info`)."""
        return self.nodes.info(node)

    # -- the stream --------------------------------------------------------------------------
    def _reject(self, reason: str, **fields: Any) -> None:
        self._rejected.labels("agent", reason).inc()
        self._ratelog.warning(reason, "agent message rejected", **fields)

    async def _notify(self, cbs: list[Callback], *args: Any) -> None:
        for cb in cbs:
            try:
                res = cb(*args)
                if asyncio.iscoroutine(res):
                    await res
            except Exception as e:
                event(log, logging.ERROR, "agent callback failed", callback=repr(cb), error=repr(e))

    async def Connect(self, request_iterator, context):  # noqa: N802 (gRPC method name)
        """Serve one agent stream (see module docstring).

        Written as an async generator: only this coroutine writes to the stream (acks and control
        messages come through the session queue, in order), while a reader task checks what the
        agent sends and hands it to the fault center without waiting for the commit (up to
        :data:`MAX_IN_FLIGHT` messages): many messages of a stream share one commit, and each is
        acked here once its commit returned, never before.
        """
        # Accepted (the token interceptor let it through): the response headers go out now, before
        # the Hello is read. The agent waits for them before it writes (faultmesh.agent.open_stream),
        # so a refusal (a trailers-only answer) never races its first message (issue 35).
        await context.send_initial_metadata(self.parts.header())  # it collects snapshot parts
        try:
            first = await wait_for(anext(request_iterator), 30.0)
        except (StopAsyncIteration, TimeoutError):
            self._reject("no_hello")
            return
        refusal = hello_refusal(first)
        if refusal is not None:
            self._reject(refusal[0])
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, refusal[1])
        h = first.hello
        agent = h.agent or "agent"
        session = AgentSession(
            h.node, agent, h.boot_id, h.node_ip, h.node_sn, context.peer(), control=self.control.new_log()
        )
        old = self.sessions.get((h.node, agent))
        if old is not None:
            take_over(old, session, self.takeovers)
        else:
            self._per_agent[agent] = self._per_agent.get(agent, 0) + 1
        # before anything new: what the previous stream of this agent sent and got no ack for
        self.control.carry_over(session, old, takeover_reason(old, session) if old else "ended")
        self.sessions[(h.node, agent)] = session
        self.nodes.hello(h.node, h.node_ip, h.node_sn, h.boot_id, agent, dict(h.labels))
        self.nodes.agent_seen(h.node, agent)
        self.nodes.set_stale(h.node, agent, None)
        self._count(agent)
        event(log, logging.INFO, "agent connected", node=h.node, agent=agent, peer=context.peer())
        if h.snapshot_digest or h.claim_seq:  # the digest claim rides on the Hello: as its Delta
            claim = agent_pb2.Delta(seq=h.claim_seq, snapshot_digest=h.snapshot_digest or b"\0")
            await self._handle(session, agent_pb2.AgentMessage(delta=claim))
        reader = asyncio.create_task(self._read_loop(session, request_iterator), name=f"agent-read-{h.node}")
        reader.add_done_callback(lambda _: session.queue.put_nowait(END))
        queue = session.queue
        try:
            while True:  # the one writer of this stream: acks in message order, control messages
                msg = await queue.get()
                if msg is None or msg is END:
                    return
                if type(msg) is Pending:
                    msg = await self._settle(session, msg)
                    yield msg
                    if msg.ack.error.startswith(INTERNAL_ERROR):
                        return  # not stored: the agent reconnects and resends all by snapshot
                    continue
                if msg.seq and session.closed:
                    continue  # a control message of a closed stream: its agent's next one gets it
                yield msg
        finally:
            reader.cancel()
            with contextlib.suppress(BaseException):
                await reader
            while not queue.empty():  # never acked: the agent resends them by snapshot
                left = queue.get_nowait()
                if type(left) is Pending and left.fut is not None:
                    left.fut.add_done_callback(retrieve)
            session.closed = True
            self.parts.drop(session, "stream ended")  # nothing of a snapshot whose last part missed
            if self.sessions.get((session.node, session.agent)) is session:
                del self.sessions[(session.node, session.agent)]
                self._per_agent[session.agent] -= 1
                self.nodes.set_stale(session.node, session.agent, "Disconnected")  # its faults stay
                self.nodes.agent_seen(session.node, session.agent)  # the expiry clock starts
                self.control.ended(session)  # its unacked control messages wait for the next stream
                event(log, logging.INFO, "agent disconnected", node=session.node, agent=session.agent)
            self._count(session.agent)

    def _owned(self, s: AgentSession, ups: list, rms: list) -> tuple[list, list, int]:
        """:func:`~clusterd.ingest.agentinput.owned_only` of ``s``'s agent; refusals are counted."""
        keep_ups, keep_rms, refused = owned_only(self.center.origin, s.agent, ups, rms)
        if refused:
            self._reject("foreign_origin", node=s.node, agent=s.agent, refused=refused)
        return keep_ups, keep_rms, refused

    def _count(self, agent: str) -> None:
        self.connected_gauge.labels(agent).set(self._per_agent.get(agent, 0))

    async def _read_loop(self, session: AgentSession, request_iterator) -> None:
        try:
            async for msg in request_iterator:
                if session.closed:
                    return
                session.last_seen = time.time()
                if session.stale:
                    session.stale = False
                    self.nodes.set_stale(session.node, session.agent, None)
                    event(log, logging.INFO, "agent live again", node=session.node, agent=session.agent)
                await self._handle(session, msg)
                if session.closed:
                    return
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the peer vanished or sent garbage: end this stream only
            event(
                log, logging.INFO, "agent stream ended", node=session.node, agent=session.agent, error=repr(e)
            )

    def _ack(self, s: AgentSession, seq: int, error: str = "", digest: int = 0) -> None:
        self.control.queue(
            s, agent_pb2.ControlMessage(seq=0, ack=agent_pb2.Ack(seq=seq, error=error, digest=digest))
        )

    def _resync(self, s: AgentSession, reason: str, seq: int, detail: str) -> None:
        """Refuse message ``seq`` of ``s`` for its order (``reason``): not applied, acked
        ``resync: <reason>: <detail>``, the stream ended; the agent resends all by snapshot."""
        detail = f"{RESYNC_ERROR}: {reason}: {detail}"
        self._reject(reason, node=s.node, agent=s.agent, detail=detail)
        self._ack(s, seq, detail)
        s.closed = True

    async def _handle(self, s: AgentSession, msg: agent_pb2.AgentMessage) -> None:
        kind = msg.WhichOneof("body")
        counter = self._kind_counters.get(kind)
        if counter is None:
            counter = self._kind_counters[kind] = self.messages.labels(kind or "empty")
        counter.inc()
        if kind == "ack":
            self.control.acked(s, msg.ack.seq)
            if msg.ack.error:
                event(
                    log,
                    logging.WARNING,
                    "agent rejected control",
                    node=s.node,
                    agent=s.agent,
                    seq=msg.ack.seq,
                    error=msg.ack.error,
                )
            return
        if kind not in ("snapshot", "delta"):
            self._reject("unexpected_message", node=s.node, kind=kind)
            return
        body = getattr(msg, kind)
        if s.parts is not None or (kind == "snapshot" and (body.parts > 1 or body.part)):
            body = self.parts.take(s, kind, body)  # held until its last part (clusterd.ingest.parts)
            if body is None:
                return
        elif bad_seq := seq_error(s.last_seq, kind, body.seq):
            self._resync(s, bad_seq, body.seq, f"{kind} seq {body.seq} after {s.last_seq}")
            return
        s.last_seq = body.seq
        try:
            n = len(body.faults) if kind == "snapshot" else len(body.upserts) + len(body.removals)
            if n > MAX_FAULTS_PER_MESSAGE:
                raise AgentInputError(
                    f"too_many_faults: {n} faults in one message, limit {MAX_FAULTS_PER_MESSAGE}"
                )
            if kind == "snapshot" and n > MAX_FAULTS_PER_NODE:
                raise AgentInputError(
                    f"too_many_faults: {n} faults for node {s.node}, limit {MAX_FAULTS_PER_NODE} per agent"
                )
            if kind == "snapshot":
                check_state(self.nodes, s.node, body.conditions, body.devices, body.node_status, replace=True)
                pending = pending_sources(body.pending_sources)
                faults, _, refused = self._owned(s, await check_faults(s.node, body.faults), [])
                if s.closed:  # taken over meanwhile: the newer stream owns this (node, agent)
                    return
                views = snapshot_views(body)
                try:
                    mark = snapshot_mark(body, views, pending, refused)
                except AgentInputError as e:  # applied all the same, without a mark
                    self._reject("bad_digest", node=s.node, agent=s.agent, detail=str(e))
                    mark = None
                # sources pending their first poll keep their faults; only a complete poll clears
                fut = self.center.submit(faults, (), (s.node, s.agent), s.agent, pending, mark)
                item = Pending(kind, body, fut, refused, pending, views)
            elif body.snapshot_digest:  # a claim: the stored state is that of this digest?
                bad = claim_error(body)
                if bad:
                    raise AgentInputError(bad)
                item = Pending("claim", body, self.center.check_mark(s.node, s.agent))
            else:
                check_state(self.nodes, s.node, body.conditions, body.devices, body.node_status, sent=s.sent)
                ups = [check_fault(s.node, m) for m in body.upserts]
                rms = [key_from_pb(k, s.node) for k in body.removals]
                ups, rms, refused = self._owned(s, ups, rms) if ups or rms else (ups, rms, 0)
                if s.closed:
                    return
                fut = (
                    self.center.submit(
                        ups,
                        rms,
                        origin=s.agent,
                        lane=(s.node, s.agent),
                        cap=((s.node, s.agent), MAX_FAULTS_PER_NODE) if ups else None,
                    )  # fmt: skip
                    if ups or rms
                    else None
                )
                item = Pending(kind, body, fut, refused)
        except AgentInputError as e:
            reason = str(e).split(":", 1)[0]
            self._reject(reason, node=s.node, agent=s.agent, detail=str(e))
            claim = kind == "delta" and bool(body.snapshot_digest)
            if claim:
                self._snap_mismatch.inc()
            self._ack(s, body.seq, str(e), agent_pb2.DIGEST_MISMATCH if claim else 0)
            return
        s.note_sent(body, replace=kind == "snapshot" and not item.pending)
        # pipelined: the next message is read while this one commits; the writer acks in order
        while s.in_flight >= MAX_IN_FLIGHT:
            s.room.clear()
            await s.room.wait()
        s.in_flight += 1
        s.queue.put_nowait(item)

    async def _settle(self, s: AgentSession, p: Pending) -> agent_pb2.ControlMessage:
        """Wait until ``p`` is durable, apply its node state and callbacks; its Ack (an
        ``internal:`` one when the state write failed: then nothing of it was applied)."""
        s.in_flight -= 1
        if s.in_flight == MAX_IN_FLIGHT - 1:
            s.room.set()
        body = p.body
        result = None
        if p.fut is not None:
            try:
                result = await p.fut
            except ScopeFull as e:  # refused, nothing applied: like a refusal of the reader's checks
                why = f"too_many_faults: node {s.node} would hold {e.held} faults, limit {e.cap} per agent"
                self._reject("too_many_faults", node=s.node, agent=s.agent, detail=why)
                return agent_pb2.ControlMessage(ack=agent_pb2.Ack(seq=body.seq, error=why))
            except Exception as e:  # state write failed: nothing applied; the agent resyncs
                s.closed = True  # the reader applies nothing more; the writer ends the stream
                event(
                    log, logging.ERROR, "agent message not applied", node=s.node, agent=s.agent, error=str(e)
                )
                return agent_pb2.ControlMessage(
                    ack=agent_pb2.Ack(seq=body.seq, error=f"{INTERNAL_ERROR}: {e}")
                )
        if p.kind == "snapshot":
            conditions, devices = p.views
            self.nodes.update(
                s.node,
                conditions=conditions,
                devices=devices,
                # while sources are pending the last known status stays (none known: take it)
                status=body.node_status if not p.pending or not self.nodes.status(s.node) else "",
                replace=not p.pending,  # pending: merged, the complete snapshot replaces
                owner=s.agent,
            )
            self.nodes.set_pending(s.node, s.agent, p.pending)
            self._snap_full.inc()
            await self._notify(self._on_connect, s.node, s.agent)
        elif p.kind == "claim":
            if not apply_claim(self.nodes, s.node, s.agent, result, body.snapshot_digest):
                self._snap_mismatch.inc()  # the agent sends its full snapshot next
                return agent_pb2.ControlMessage(
                    ack=agent_pb2.Ack(seq=body.seq, digest=agent_pb2.DIGEST_MISMATCH)
                )
            self._snap_unchanged.inc()
            await self._notify(self._on_connect, s.node, s.agent)
            return agent_pb2.ControlMessage(ack=agent_pb2.Ack(seq=body.seq, digest=agent_pb2.DIGEST_MATCH))
        else:
            if body.conditions or body.devices or body.node_status:
                self.nodes.update(
                    s.node,
                    conditions=[condition_view(c) for c in body.conditions],
                    devices=[device_view(d) for d in body.devices],
                    status=body.node_status,
                    owner=s.agent,
                )
            if body.ping_results:
                await self._notify(self._on_ping, s.node, list(body.ping_results))
            for r in body.slownode_reports:
                await self._notify(self._on_slownode, s.node, r)
        error = f"foreign_origin: {p.refused} faults of another origin not changed" if p.refused else ""
        return agent_pb2.ControlMessage(ack=agent_pb2.Ack(seq=body.seq, error=error))
