"""Agent side of the agent stream (design.md "Agent stream"): used by NodeD and deviced.

An agent keeps its current truth in :class:`AgentState` (faults by key, conditions, device states,
node status) and appends one-shot events (pingmesh rows, slow-node reports) to bounded buffers.
:class:`AgentClient` keeps one bidirectional stream to ClusterD: ``Hello``, a full ``Snapshot``,
then ``Delta``s with increasing ``seq``; ClusterD acks each seq. On every (re)connect a fresh
snapshot is sent, so nothing is lost while ClusterD is down and nothing is duplicated (a snapshot
replaces all the agent said before, except the faults of its ``pending_sources``: sources that have
not completed their first poll since the agent started keep what ClusterD had, and a new snapshot
goes out when one completes — issue 20). An ack whose error starts with ``internal:`` (ClusterD could
not store the message) is not an ack, nor is one starting with ``resync:`` (ClusterD refused its
sequence number): the session ends and the next one resends all by snapshot.
Control messages from ClusterD go to ``on_control`` and are
acked after it returns.

Unchanged resync (issue 18; agent.proto's header): every Snapshot carries its
:func:`snapshot_digest`. On a new stream the agent first sends the claim, an empty Delta with the
digest of the Snapshot it would send, and waits for its Ack (up to ``ack_timeout_s``): on
``DIGEST_MATCH`` ClusterD holds that state already and the stream goes on with Deltas; otherwise
(mismatch, an older ClusterD that acks the claim as a heartbeat, no answer in time) the full
Snapshot follows with the next seq. Once a ClusterD answered a claim (``Ack.digest`` set), the next
sessions put the claim into the Hello (``snapshot_digest``, ``claim_seq``); a Hello claim left
unanswered (a downgraded ClusterD) costs ``ack_timeout_s``, then the full Snapshot, and the next
session uses the Delta claim again. ``resync_by_digest=False`` always sends the full Snapshot.
A Snapshot over ~1 MiB goes in parts (agent.proto's "Snapshot parts") when ClusterD's response
headers say it collects them; to an older ClusterD, one over its 4 MiB limit is not sent (logged).

Timings (issue 3): a change is sent at once unless a report went out less than
``min_report_interval_s`` ago (then coalesced, last state wins); the full state is re-sent every
``resend_every_s`` (1800 s); reconnects back off exponentially up to ``backoff_max_s``. Liveness
(issue 20): an empty Delta goes out after ``heartbeat_s`` (10 s) without a message, so ClusterD can
mark a hung agent stale; gRPC keepalive pings every ``keepalive_s`` (60 s, ack within 5 s).

Opening (issue 35): nothing is written before ClusterD accepted the stream (:func:`open_stream`), so
a refusal reaches the agent with ClusterD's own status. A token refusal (UNAUTHENTICATED) is logged
``clusterd refused the token`` once per attempt (one per backoff cycle), counted in
``faultmesh_agent_token_refused_total``, and :meth:`AgentClient.readiness` (the agent's ``/readyz``
text) says so until a stream is up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge

from faultmesh._pb import agent_pb2, agent_pb2_grpc
from faultmesh.agentconf import (  # noqa: F401 - re-exported: the agents import them from here
    CHANNEL_OPTIONS,
    HEARTBEAT_S,
    KEEPALIVE_S,
    KEEPALIVE_TIMEOUT_S,
    MAX_MESSAGE_BYTES,
    add_clusterd_arguments,
    agent_options,
    channel_credentials,
    channel_options,
    check_clusterd_arguments,
)
from faultmesh.agentstate import (  # noqa: F401 - re-exported: the agents import them from here
    DIGEST_SIZE,
    SNAPSHOT_PART_BYTES,
    AgentState,
    snapshot_digest,
    snapshot_parts,
)
from faultmesh.log import event
from faultmesh.retry import Backoff
from faultmesh.runtime import TaskOwner, wait_for
from faultmesh.wire import snapshot_max_bytes

log = logging.getLogger("faultmesh.agent")

# Ack.error prefix ClusterD uses for a valid message it could not store (clusterd.ingest.agents
# INTERNAL_ERROR): such a seq is not acked, the session ends and the next one sends a snapshot.
NOT_STORED_PREFIX = "internal:"
# Ack.error prefix of a message ClusterD refused for its seq (clusterd.ingest.agents RESYNC_ERROR: a
# gap, a replay, out of order): not applied, so not acked; the next session resends all by snapshot.
RESYNC_PREFIX = "resync:"
# How long a new stream waits for ClusterD's response headers (its acceptance) before the Hello goes
# out anyway: an older ClusterD sends them only with its first answer (s).
ACCEPT_TIMEOUT_S = 5.0

ControlHandler = Callable[[agent_pb2.ControlMessage], Awaitable[None]]


class AgentMetrics:
    """Prometheus metrics of the agent stream (registered on the agent's registry)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.connected = Gauge(
            "faultmesh_agent_connected", "1 while the agent stream to ClusterD is up", registry=registry
        )
        self.sent = Counter(
            "faultmesh_agent_messages_sent_total", "Messages sent to ClusterD", ["kind"], registry=registry
        )
        self.reconnects = Counter(
            "faultmesh_agent_reconnects_total", "Agent stream (re)connect attempts", registry=registry
        )
        self.controls = Counter(
            "faultmesh_agent_control_messages_total", "Control messages received", ["kind"], registry=registry
        )
        self.token_refused = Counter(
            "faultmesh_agent_token_refused_total",
            "Agent stream attempts ClusterD refused for the bearer token (UNAUTHENTICATED)",
            registry=registry,
        )


def split_targets(target: str) -> list[str]:
    """``"a:1,b:2"`` -> ``["a:1", "b:2"]``; a target with a gRPC scheme (``ipv4:a,b``, ``dns:...``)
    stays one target (the channel resolves it)."""
    if target.split(":", 1)[0] in ("dns", "ipv4", "ipv6", "unix", "unix-abstract", "xds"):
        return [target]
    return [t.strip() for t in target.split(",") if t.strip()] or [target]


async def open_stream(
    channel: grpc.aio.Channel, metadata, accept_timeout_s: float = ACCEPT_TIMEOUT_S
) -> grpc.aio.StreamStreamCall:
    """Open ``faultmesh.v1.AgentStream/Connect`` on ``channel`` (``metadata``: the bearer token pair,
    or None) and return the call once ClusterD accepted it: its response headers arrived, which
    :meth:`clusterd.ingest.agents.AgentHub.Connect` sends before reading anything.

    Raises ``grpc.aio.AioRpcError`` with ClusterD's status when it refused the stream
    (UNAUTHENTICATED for the token, UNAVAILABLE from a follower or an unreachable ClusterD): a refusal
    is a trailers-only answer, and a message written into a stream that is being refused makes
    grpcio's client report INTERNAL "Internal error from Core" instead of that status (issue 35).
    After ``accept_timeout_s`` (s) without headers (an older ClusterD) the call is returned as it is.
    """
    call = agent_pb2_grpc.AgentStreamStub(channel).Connect(metadata=metadata)
    with contextlib.suppress(TimeoutError):
        await wait_for(call.initial_metadata(), accept_timeout_s)
        if call.done():
            await call.read()  # raises the refusal's status
            raise ConnectionError("clusterd closed the stream")
    return call


class AgentClient:
    """Keeps the agent stream to ClusterD at ``target`` (host:port) up, forever, until :meth:`stop`.

    ``target`` may list several addresses (``host1:port,host2:port``, clusterd replicas without a
    Service in front): after a failed or refused session (a follower answers UNAVAILABLE) the next
    one is tried. A gRPC scheme target (``dns:``, ``ipv4:``, ...) is used as it is.

    ``state`` is the agent's :class:`AgentState`; mutate it and the client sends deltas.
    ``credentials`` (grpc.ChannelCredentials) enables TLS; ``token`` is sent as a bearer token.
    ``accept_timeout_s``: how long a new stream waits for ClusterD's acceptance (:func:`open_stream`).
    ``resync_by_digest`` (default True): each session opens with the digest claim and sends the full
    Snapshot only when ClusterD does not answer ``DIGEST_MATCH`` within ``ack_timeout_s`` (module
    docstring); False: always the full Snapshot. ``labels``: the Hello's labels, the agent's modes
    (deviced's ``graceTolerance=on``: :mod:`faultmesh.exclusions`).
    """

    def __init__(
        self,
        target: str,
        node: str,
        agent: str,
        *,
        state: AgentState | None = None,
        node_ip: str = "",
        node_sn: str = "",
        on_control: ControlHandler | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        token: str | None = None,
        registry: CollectorRegistry | None = None,
        min_report_interval_s: float = 0.0,
        resend_every_s: float = 1800.0,
        backoff_max_s: float = 10.0,
        ack_timeout_s: float = 30.0,
        keepalive_s: float = KEEPALIVE_S,
        keepalive_timeout_s: float = KEEPALIVE_TIMEOUT_S,
        heartbeat_s: float = HEARTBEAT_S,
        resync_by_digest: bool = True,
        accept_timeout_s: float = ACCEPT_TIMEOUT_S,
        labels: dict[str, str] | None = None,
    ) -> None:
        self.targets = split_targets(target)
        self.target = self.targets[0]
        self.state = state or AgentState(node)
        self.state.on_change = self._wake
        self.hello = agent_pb2.Hello(
            node=node,
            agent=agent,
            boot_id=uuid.uuid4().hex,
            version="0.1.0",
            node_ip=node_ip,
            node_sn=node_sn,
            labels=labels or {},
        )
        self.on_control = on_control
        self.credentials = credentials
        self.token = token
        self.metrics = AgentMetrics(registry or CollectorRegistry())
        self.min_report_interval_s = min_report_interval_s
        self.resend_every_s = resend_every_s
        self.backoff_max_s = backoff_max_s
        self.ack_timeout_s = ack_timeout_s
        self.channel_options = channel_options(keepalive_s, keepalive_timeout_s)
        self.heartbeat_s = heartbeat_s
        self.resync_by_digest = resync_by_digest
        self.accept_timeout_s = accept_timeout_s
        self.down_reason = "connecting"  # why no stream is up ("" while one is): readiness()
        self._claim: tuple[int, asyncio.Future] | None = None  # (seq, answer) of the digest claim
        self._digest_peer = False  # the last claim was answered: the next one rides on the Hello
        self.seq = 0
        self.acked_seq = 0
        self.connected = asyncio.Event()
        self.synced = asyncio.Event()  # set when ClusterD acked everything sent so far
        self._wakeup = asyncio.Event()
        self._tasks = TaskOwner(f"agent-{agent}")
        self._stopping = False
        self._last_report = 0.0
        self._last_sent = 0.0  # monotonic time of the last message written (heartbeat clock)
        self._writing = asyncio.Lock()  # one write at a time on the session's stream (_write)

    def readiness(self) -> str:
        """The stream's part of the agent's ``/readyz`` text: ``clusterd=up``, or ``clusterd=down
        (<why>)`` (``connecting``, ``clusterd refused the token: bearer token does not match``,
        ``UNAVAILABLE: <detail>``, ...)."""
        return "clusterd=up" if self.connected.is_set() else f"clusterd=down ({self.down_reason})"

    def _wake(self) -> None:
        self.synced.clear()
        self._wakeup.set()

    async def start(self) -> None:
        """Start the connection loop in the background."""
        self._tasks.spawn(self._run(), name="agent-stream")

    async def stop(self, drain_s: float = 2.0) -> None:
        """Send what is pending (up to ``drain_s`` s), then close the stream."""
        if self.connected.is_set() and self.state.has_pending():
            self._wakeup.set()
            with contextlib.suppress(TimeoutError):
                await wait_for(self.synced.wait(), drain_s)
        self._stopping = True
        await self._tasks.close()

    async def wait_synced(self, timeout_s: float = 10.0) -> None:
        """Wait until ClusterD acked the current state. Raises ``TimeoutError``."""
        await wait_for(self.synced.wait(), timeout_s)

    def _channel(self) -> grpc.aio.Channel:
        if self.credentials is not None:
            return grpc.aio.secure_channel(self.target, self.credentials, options=self.channel_options)
        return grpc.aio.insecure_channel(self.target, options=self.channel_options)

    async def _run(self) -> None:
        backoff = Backoff(0.5, max(0.5, self.backoff_max_s))
        while not self._stopping:
            self.metrics.reconnects.inc()
            started = time.monotonic()
            try:
                await self._session()
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as e:
                self._stream_down(e)
            except Exception as e:  # a bug must not end the agent: log and reconnect
                self.down_reason = repr(e)[:200]
                event(log, logging.ERROR, "clusterd stream error", target=self.target, error=repr(e))
            finally:
                self.connected.clear()
                self.metrics.connected.set(0)
                self.down_reason = self.down_reason or "clusterd closed the stream"
            backoff.success_after(time.monotonic() - started)  # a session that stayed up 30 s
            self.target = self.targets[(self.targets.index(self.target) + 1) % len(self.targets)]
            await asyncio.sleep(backoff.next_delay())

    def _stream_down(self, e: grpc.aio.AioRpcError) -> None:
        """Log, count and remember (for :meth:`readiness`) why the stream ended or was refused."""
        code, detail = e.code(), e.details() or ""
        if code == grpc.StatusCode.UNAUTHENTICATED:
            self.metrics.token_refused.inc()
            self.down_reason = f"clusterd refused the token: {detail}"
            event(
                log,
                logging.WARNING,
                "clusterd refused the token",
                target=self.target,
                token="set" if self.token else "none",
                detail=detail,
            )
            return
        self.down_reason = f"{code.name}: {detail}"[:200]
        event(log, logging.WARNING, "clusterd stream down", target=self.target, code=code.name, detail=detail)

    async def _session(self) -> None:
        metadata = (("authorization", f"Bearer {self.token}"),) if self.token else None
        async with self._channel() as channel:
            call = await open_stream(channel, metadata, self.accept_timeout_s)
            reader = asyncio.create_task(self._read(call), name="agent-read")
            try:
                await self._first_snapshot(call, reader)
            except BaseException:
                reader.cancel()
                with contextlib.suppress(BaseException):
                    await reader
                raise
            last_snapshot = self._last_sent = time.monotonic()
            self.down_reason = ""
            self.connected.set()
            self.metrics.connected.set(1)
            event(
                log,
                logging.INFO,
                "clusterd stream up",
                target=self.target,
                node=self.hello.node,
                agent=self.hello.agent,
            )
            try:
                while True:
                    if reader.done():
                        reader.result()
                        return
                    wait_s = max(0.0, self.resend_every_s - (time.monotonic() - last_snapshot))
                    if self.heartbeat_s > 0:
                        wait_s = min(
                            wait_s, max(0.0, self.heartbeat_s - (time.monotonic() - self._last_sent))
                        )
                    self._wakeup.clear()
                    if not self.state.has_pending():
                        waker = asyncio.create_task(self._wakeup.wait())
                        try:
                            done, _ = await asyncio.wait(
                                {waker, reader}, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED
                            )
                        finally:
                            waker.cancel()  # also when the session itself is cancelled
                        if reader in done:
                            continue
                    if time.monotonic() - last_snapshot >= self.resend_every_s or self.state.needs_snapshot:
                        self.seq += 1
                        await self._write_snapshot(call, self.state.snapshot(self.seq))
                        self.metrics.sent.labels("snapshot").inc()
                        last_snapshot = self._last_sent = time.monotonic()
                        continue
                    if not self.state.has_pending():
                        if 0 < self.heartbeat_s <= time.monotonic() - self._last_sent:
                            await self._write_delta(call)  # empty: the heartbeat
                        continue
                    gap = self.min_report_interval_s - (time.monotonic() - self._last_report)
                    if gap > 0:
                        await asyncio.sleep(gap)  # coalesce: last state wins
                    await self._write_delta(call)
                    self._last_report = time.monotonic()
            finally:
                reader.cancel()
                with contextlib.suppress(BaseException):
                    await reader
                call.cancel()

    async def _first_snapshot(self, call, reader: asyncio.Task) -> None:
        """The session's Hello and first state message: the digest claim (in the Hello when this
        ClusterD answered one before) and, unless ClusterD answers ``DIGEST_MATCH``, the full
        Snapshot (see the module docstring)."""
        self.seq += 1
        snap = self.state.snapshot(self.seq)
        if not self.resync_by_digest:
            await self._write(call, agent_pb2.AgentMessage(hello=self.hello))
        else:
            answer = asyncio.get_running_loop().create_future()
            self._claim = (self.seq, answer)
            in_hello = self._digest_peer
            if in_hello:  # one message less: the claim rides on the Hello
                hello = agent_pb2.Hello(snapshot_digest=snap.digest, claim_seq=self.seq)
                hello.MergeFrom(self.hello)
                await self._write(call, agent_pb2.AgentMessage(hello=hello))
            else:
                await self._write(call, agent_pb2.AgentMessage(hello=self.hello))
                claim = agent_pb2.Delta(seq=self.seq, snapshot_digest=snap.digest)
                await self._write(call, agent_pb2.AgentMessage(delta=claim))
            self.metrics.sent.labels("digest").inc()
            done, _ = await asyncio.wait(
                {answer, reader}, timeout=self.ack_timeout_s, return_when=asyncio.FIRST_COMPLETED
            )
            self._claim = None
            if reader in done:
                reader.result()  # raises what ended the stream
                raise ConnectionError("clusterd closed the stream")
            got = answer.result() if answer in done else None
            # an answer says this ClusterD knows digests; silence to a Hello claim: an older one
            self._digest_peer = got in (agent_pb2.DIGEST_MATCH, agent_pb2.DIGEST_MISMATCH)
            if got == agent_pb2.DIGEST_MATCH:
                return  # clusterd holds this state; changes since the claim go as deltas
            self.seq += 1
            snap = self.state.snapshot(self.seq)  # the state now (changes since the claim included)
        await self._write_snapshot(call, snap)
        self.metrics.sent.labels("snapshot").inc()

    async def _write_snapshot(self, call, snap: agent_pb2.Snapshot) -> None:
        """Write a Snapshot: in parts of about :data:`SNAPSHOT_PART_BYTES` (agent.proto's "Snapshot
        parts") when it is larger and this ClusterD said it collects parts, else as one message.
        Raises ``ConnectionError`` (logged) when ClusterD cannot take it: "state too large for one
        message" over its 4 MiB receive limit from a ClusterD without parts (grpcio would fail the
        stream with INTERNAL "Internal error from Core" instead), "state too large for clusterd" over
        the bytes it collects in parts."""
        if snap.ByteSize() > SNAPSHOT_PART_BYTES and (most := await self._parts_max_bytes(call)):
            parts = snapshot_parts(snap)
            size = sum(p.ByteSize() for p in parts)
            if size > most:
                event(log, logging.ERROR, "state too large for clusterd", bytes=size, limit=most,
                      faults=len(snap.faults))  # fmt: skip
                raise ConnectionError(f"state too large for clusterd: {size} bytes > {most}")
            for part in parts:
                await self._write(call, agent_pb2.AgentMessage(snapshot=part))
            self.metrics.sent.labels("snapshot_part").inc(len(parts))
            return
        msg = agent_pb2.AgentMessage(snapshot=snap)
        size = msg.ByteSize()
        if size > MAX_MESSAGE_BYTES:
            event(log, logging.ERROR, "state too large for one message", bytes=size,
                  limit=MAX_MESSAGE_BYTES, faults=len(snap.faults))  # fmt: skip
            raise ConnectionError(f"state too large for one message: {size} bytes > {MAX_MESSAGE_BYTES}")
        await self._write(call, msg)

    async def _parts_max_bytes(self, call) -> int:
        """The bytes of one snapshot in parts the ClusterD of ``call`` collects (its response header,
        :func:`faultmesh.wire.snapshot_max_bytes`), 0 when it takes no parts (an older ClusterD, or
        no headers within ``accept_timeout_s``)."""
        with contextlib.suppress(TimeoutError):
            return snapshot_max_bytes(await wait_for(call.initial_metadata(), self.accept_timeout_s))
        return 0

    async def _write(self, call, msg: agent_pb2.AgentMessage) -> None:
        """Write ``msg`` on ``call`` once no other write of this client is in progress. The session
        (Hello, snapshots, deltas) and its reader (acks of control messages) both write: grpcio allows
        one write at a time on a call, and a second one started before the first completed fails
        the whole stream with INTERNAL "Internal error from Core" (GRPC_CALL_ERROR_TOO_MANY_OPERATIONS;
        seen as a stream that went up and failed at once when a restarted ClusterD pushed its control
        state while the agent wrote its first deltas)."""
        async with self._writing:
            await call.write(msg)

    async def _write_delta(self, call) -> None:
        self.seq += 1
        await self._write(call, agent_pb2.AgentMessage(delta=self.state.take_delta(self.seq)))
        self._last_sent = time.monotonic()
        self.metrics.sent.labels("delta").inc()

    async def _read(self, call) -> None:
        while True:
            msg = await call.read()
            if msg is grpc.aio.EOF:
                raise ConnectionError("clusterd closed the stream")
            kind = msg.WhichOneof("body")
            if kind == "ack":
                if msg.ack.error.startswith((NOT_STORED_PREFIX, RESYNC_PREFIX)):
                    # valid but not stored (ClusterD's state write failed): not acked; a new session
                    # resends everything by snapshot
                    raise ConnectionError(f"clusterd did not take seq {msg.ack.seq}: {msg.ack.error}")
                claim = self._claim
                if claim is not None and msg.ack.seq == claim[0]:
                    if not claim[1].done():
                        claim[1].set_result(msg.ack.digest)
                    if msg.ack.digest != agent_pb2.DIGEST_MATCH:  # not taken: the full snapshot follows
                        if msg.ack.error:
                            event(log, logging.WARNING, "digest claim refused", error=msg.ack.error)
                        continue
                if msg.ack.error:
                    event(
                        log,
                        logging.WARNING,
                        "clusterd rejected message",
                        seq=msg.ack.seq,
                        error=msg.ack.error,
                    )
                self.acked_seq = max(self.acked_seq, msg.ack.seq)
                if self.acked_seq >= self.seq and not self.state.has_pending():
                    self.synced.set()
                continue
            self.metrics.controls.labels(kind or "empty").inc()
            if self.on_control is not None:
                try:
                    await self.on_control(msg)
                    err = ""
                except Exception as e:  # a bad control message is rejected, never fatal
                    err = repr(e)
                    event(log, logging.WARNING, "control message rejected", kind=kind, error=err)
            else:
                err = ""
            await self._write(call, agent_pb2.AgentMessage(ack=agent_pb2.Ack(seq=msg.seq, error=err)))
