"""A load generator that can out-run clusterd (issue 18): worker processes playing agents and
public-fault senders, and the trivial peer server every bench measures beside clusterd.

- :class:`Fleet` starts ``procs`` worker processes (default: one per core minus one, left to the
  server), each with its own uvloop, gRPC channels and a slice of the agents. A job (``resync``,
  ``deltas``, ``pubfault``) runs in every worker at once; each returns its counts, sampled
  latencies (seconds) and its own CPU seconds, which :meth:`Fleet.run` sums, so every bench can print
  the client's CPU beside its figure (a client near ``procs`` cores is the limit, not the server).
- :class:`EchoServer` is a trivial ``grpc.aio`` server in its own process answering the same
  messages (an Ack per Snapshot/Delta, code 0 per SendPublicFault) without any work: the baseline
  measured in the same run on the same machine, so a figure reads as a ratio on a noisy box.

Agents speak the real protocol (Hello, Snapshot, Delta, Ack by seq; design.md "Agent stream") with
pre-serialized messages, so a worker spends its CPU on the wire, not on building protobufs. Their
snapshots carry a digest, and a ``claim`` job opens each stream with the digest claim instead
(agent.proto: the full snapshot follows only when clusterd answers ``DIGEST_MISMATCH``).
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import os
import subprocess
import sys
import time
import uuid
from typing import Any

import grpc

from faultmesh._pb import agent_pb2, pubfault_pb2
from faultmesh.agent import snapshot_digest

CONNECT = "/faultmesh.v1.AgentStream/Connect"
PUBFAULT = "/PubFault/SendPublicFault"
MAX_SAMPLES = 20_000  # latencies kept per worker and job (evenly thinned)


def default_procs() -> int:
    """One worker per core minus one (left to the server under test); at least one."""
    return max(1, (os.cpu_count() or 2) - 1)


# -- messages -------------------------------------------------------------------------------------
def node_name(i: int) -> str:
    """The bench's node name of agent index ``i``."""
    return f"node-{i:05d}"


def snapshot_bytes(node: str, npus: int, faults: int, seq: int = 1, changed: bool = False) -> bytes:
    """A deviced Snapshot (``npus`` healthy NPUs, ``faults`` NPU faults) as one serialized AgentMessage;
    ``changed`` gives every NPU another health and every fault another level than the unchanged one."""
    health = "SubHealthy" if changed else "Healthy"
    devices = [
        agent_pb2.DeviceState(
            device_type="NPU", device_id=i, phy_id=i, health=health, network_health="Healthy",
            level="NotHandleFault", super_pod_id=-1, server_index=-1,
        )
        for i in range(npus)
    ]  # fmt: skip
    level = "RestartNPU" if changed else "PreSeparateNPU"
    fl = [
        agent_pb2.Fault(
            source="dcmi", node=node, device_type="NPU", device_id=k % max(1, npus),
            code=f"80E1{k:04X}", level=level, first_seen_ms=1_700_000_000_000, last_seen_ms=1_700_000_000_000,
        )
        for k in range(faults)
    ]  # fmt: skip
    snap = agent_pb2.Snapshot(seq=seq, faults=fl, devices=devices)
    snap.digest = snapshot_digest(snap)
    return agent_pb2.AgentMessage(snapshot=snap).SerializeToString()


def claim_bytes(snapshot: bytes, seq: int) -> bytes:
    """The digest claim (an empty Delta with ``snapshot_digest``) of a serialized snapshot message."""
    digest = agent_pb2.AgentMessage.FromString(snapshot).snapshot.digest
    return agent_pb2.AgentMessage(delta=agent_pb2.Delta(seq=seq, snapshot_digest=digest)).SerializeToString()


def hello_claim_bytes(node: str, agent: str, claim: bytes) -> bytes:
    """A serialized Hello carrying the digest claim ``claim`` (a serialized claim message)."""
    delta = agent_pb2.AgentMessage.FromString(claim).delta
    hello = agent_pb2.Hello(
        node=node, agent=agent, boot_id="boot-1", snapshot_digest=delta.snapshot_digest, claim_seq=delta.seq
    )
    return agent_pb2.AgentMessage(hello=hello).SerializeToString()


def noded_snapshot_bytes(node: str, seq: int = 1) -> bytes:
    """A noded Snapshot: node status UnHealthy and one BMC disk fault, serialized."""
    fault = agent_pb2.Fault(
        source="bmc-oem", node=node, device_type="Disk", device_id=1, code="2C000031", level="SeparateFault"
    )
    snap = agent_pb2.Snapshot(seq=seq, node_status="UnHealthy", faults=[fault])
    snap.digest = snapshot_digest(snap)
    return agent_pb2.AgentMessage(snapshot=snap).SerializeToString()


def hello_bytes(node: str, agent: str = "deviced", boot_id: str = "boot-1") -> bytes:
    """A serialized Hello."""
    return agent_pb2.AgentMessage(
        hello=agent_pb2.Hello(node=node, agent=agent, boot_id=boot_id)
    ).SerializeToString()


def delta_faults(per_msg: int, variant: int) -> list[agent_pb2.Fault]:
    """``per_msg`` noded upserts of one of 128 variants (keys and levels cycle), built once per bench."""
    return [
        agent_pb2.Fault(
            source="bmc-oem", device_type="Memory", device_id=(variant * per_msg + k) % 8,
            code=f"{(variant * per_msg + k) % 64:08X}", level="SeparateFault" if variant % 2 else "SubHealthFault",
        )
        for k in range(per_msg)
    ]  # fmt: skip


def pubfault_bytes(i: int) -> bytes:
    """One serialized PublicFaultRequest (an NPU fault on one of 512 nodes)."""
    now = int(time.time() * 1000)
    return pubfault_pb2.PublicFaultRequest(
        id=f"bench-{uuid.uuid4().hex[:12]}", timestamp=now, version="1.0", resource="CCAE",
        faults=[pubfault_pb2.Fault(
            faultId=f"f-{i:08d}", faultType="NPU", faultCode="010001001", faultTime=now, assertion="occur",
            influence=[pubfault_pb2.PubFaultInfo(nodeName=f"node-{i % 512}", deviceIds=[i % 16])],
        )],
    ).SerializeToString()  # fmt: skip


def _ack_seq(raw: bytes) -> tuple[int, str]:
    m = agent_pb2.ControlMessage.FromString(raw)
    return m.ack.seq, m.ack.error


def _ack_match(raw: bytes) -> tuple[int, bool]:
    m = agent_pb2.ControlMessage.FromString(raw)
    return m.ack.seq, m.ack.digest == agent_pb2.DIGEST_MATCH


def _channels(addr: str, n: int) -> list[grpc.aio.Channel]:
    opts = [("grpc.use_local_subchannel_pool", 1), ("grpc.max_receive_message_length", 64 << 20)]
    return [grpc.aio.insecure_channel(addr, options=opts) for _ in range(max(1, n))]


def _stream(ch: grpc.aio.Channel):
    return ch.stream_stream(CONNECT, request_serializer=None, response_deserializer=None)()


def _thin(xs: list[float]) -> list[float]:
    if len(xs) <= MAX_SAMPLES:
        return xs
    step = len(xs) / MAX_SAMPLES
    return [xs[int(i * step)] for i in range(MAX_SAMPLES)]


# -- jobs (run inside a worker) -------------------------------------------------------------------
class _Worker:
    def __init__(self) -> None:
        self.calls: list = []
        self.channels: list[grpc.aio.Channel] = []
        self.streams: list[list[Any]] = []  # [call, agent index, last seq] of the last resync's streams
        self.job: dict[str, Any] = {}  # the resync job's snapshot parameters

    async def close(self) -> None:
        for c in self.calls:
            c.cancel()
        for ch in self.channels:
            await ch.close()
        self.calls, self.channels, self.streams = [], [], []

    async def resync(
        self, addr: str, agents: list[int], start_at: float, npus: int = 16, faults: int = 0,
        faulty_every: int = 10, changed: bool = False, per_channel: int = 50, concurrency: int = 256,
        agent: str = "deviced", keep: bool = False, claim: bool = False,
    ) -> dict[str, Any]:  # fmt: skip
        """Connect ``agents`` (indexes), each sending Hello + Snapshot and waiting for its ack; the
        streams stay open until :meth:`close`. ``agent`` deviced: ``npus`` NPUs, ``faults`` NPU
        faults on every ``faulty_every``-th node; noded: node status and one disk fault. ``keep``:
        the streams of the last resync stay open too (:meth:`resnap` then uses only the new ones).
        ``claim``: Hello + the digest claim, the Snapshot only when clusterd does not match it
        (``matched`` in the result counts the streams that needed no snapshot); ``"hello"``: the
        claim in the Hello, as an agent sends it to a clusterd that answered one before."""
        if not keep:
            await self.close()
        base = len(self.channels)
        self.channels += _channels(addr, (len(agents) + per_channel - 1) // per_channel)
        self.streams = []
        self.job = {"npus": npus, "faults": faults, "faulty_every": faulty_every, "agent": agent}
        msgs = [(hello_bytes(node_name(i), agent), self._snapshot(i, 1, changed)) for i in agents]
        claims = [claim_bytes(snap, 1) for _, snap in msgs] if claim else []
        if claim == "hello":  # Hello + claim as one message
            msgs = [
                (hello_claim_bytes(node_name(i), agent, c), s)
                for i, (_, s), c in zip(agents, msgs, claims, strict=True)
            ]
        sem = asyncio.Semaphore(concurrency)
        lat: list[float] = []
        retries, matched = [0], [0]

        async def one(k: int) -> None:
            hello, snap = msgs[k]
            for attempt in range(8):  # an overloaded box may fail a stream: reconnect, as agents do
                async with sem:
                    t = time.perf_counter()
                    call = _stream(self.channels[base + k // per_channel])
                    try:
                        await call.write(hello)
                        seq = 1
                        if claim:
                            if claim != "hello":
                                await call.write(claims[k])
                            got, match = _ack_match(await call.read())
                            assert got == 1, got
                            if not match:
                                seq = 2
                                await call.write(self._snapshot(agents[k], 2, changed))
                        else:
                            await call.write(snap)
                        if seq == 2 or not claim:
                            got, err = _ack_seq(await call.read())
                            assert got == seq and not err, err
                        else:
                            matched[0] += 1
                        lat.append(time.perf_counter() - t)
                        self.calls.append(call)
                        self.streams.append([call, agents[k], seq])
                        return
                    except grpc.aio.AioRpcError:
                        call.cancel()
                        retries[0] += 1
                await asyncio.sleep(0.2 * (attempt + 1))
            raise RuntimeError(f"agent {k} could not connect")

        await _sleep_until(start_at)
        c0, t0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(one(k) for k in range(len(msgs))))
        return {"n": len(msgs), "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0,
                "lat": _thin(lat), "retries": retries[0], "matched": matched[0]}  # fmt: skip

    def _snapshot(self, i: int, seq: int, changed: bool) -> bytes:
        j = self.job
        if j["agent"] == "noded":
            return noded_snapshot_bytes(node_name(i), seq)
        faults = j["faults"] if i % j["faulty_every"] == 0 else 0
        return snapshot_bytes(node_name(i), j["npus"], faults, seq=seq, changed=changed)

    async def resnap(
        self, start_at: float, changed: bool = False, claim: bool = False, empty: bool = False,
        concurrency: int = 256,
    ) -> dict[str, Any]:  # fmt: skip
        """Send one more Snapshot (the next seq; ``changed`` or the same state) on every stream the
        last :meth:`resync` left open and wait for each ack: the cost of a snapshot alone, without
        the connect. ``claim``: the digest claim of the same state instead (``matched`` counts the
        DIGEST_MATCH answers); ``empty``: an empty Delta (a heartbeat: the cost of any message)."""
        msgs = []
        for st in self.streams:
            st[2] += 1
            if empty:
                msg = agent_pb2.AgentMessage(delta=agent_pb2.Delta(seq=st[2])).SerializeToString()
            else:
                snap = self._snapshot(st[1], st[2], changed)
                msg = claim_bytes(snap, st[2]) if claim else snap
            msgs.append((st[0], msg, st[2]))
        sem = asyncio.Semaphore(concurrency)
        lat: list[float] = []
        matched = [0]

        async def one(k: int) -> None:
            async with sem:
                t = time.perf_counter()
                call, msg, want = msgs[k]
                await call.write(msg)
                raw = await call.read()
                seq, err = _ack_seq(raw)
                assert seq == want and not err, (seq, err)
                matched[0] += _ack_match(raw)[1]
                lat.append(time.perf_counter() - t)

        await _sleep_until(start_at)
        c0, t0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(one(k) for k in range(len(msgs))))
        return {"n": len(msgs), "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0,
                "lat": _thin(lat), "matched": matched[0]}  # fmt: skip

    async def deltas(
        self, addr: str, agents: list[int], start_at: float, seconds: float, rate: float = 0.0,
        window: int = 8, per_msg: int = 1, per_channel: int = 50, storm_from: int | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        """Each agent connects (empty snapshot), then streams Deltas of ``per_msg`` upserts for
        ``seconds``: at ``rate`` messages/s each (open loop, latency from the scheduled send time) or,
        with rate 0, as fast as acks return with ``window`` messages in flight. Agents with an index
        ``>= storm_from`` are storm agents (:meth:`_storm`) on nodes of their own; only the others'
        acks are counted (``storm_msgs``: what the storm agents sent)."""
        await self.close()
        self.channels = _channels(addr, (len(agents) + per_channel - 1) // per_channel)
        pre = [delta_faults(per_msg, v) for v in range(128)]
        lat: list[float] = []
        acked = [0]
        errors = [0]
        storm_msgs = [0]

        async def one(k: int, i: int) -> None:
            if storm_from is not None and i >= storm_from:
                storm_msgs[0] += await self._storm(self.channels[k // per_channel], i, start_at, seconds, pre)
                return
            call = _stream(self.channels[k // per_channel])
            await call.write(hello_bytes(f"load-{i:05d}", "noded"))
            await call.write(agent_pb2.AgentMessage(snapshot=agent_pb2.Snapshot(seq=1)).SerializeToString())
            await call.read()
            self.calls.append(call)
            await _sleep_until(start_at)
            end = time.perf_counter() + seconds
            sent: dict[int, float] = {}
            credit = asyncio.Semaphore(window)
            done = asyncio.Event()

            async def reader() -> None:
                while not (done.is_set() and not sent):
                    raw = await call.read()
                    if raw is grpc.aio.EOF:
                        return
                    seq, err = _ack_seq(raw)
                    t = sent.pop(seq, None)
                    if t is not None:
                        lat.append(time.perf_counter() - t)
                        acked[0] += 1
                        errors[0] += bool(err)
                        credit.release()

            rd = asyncio.create_task(reader())
            seq = 1
            period = 1.0 / rate if rate > 0 else 0.0
            nxt = time.perf_counter() + (k % 97) / 97 * period  # spread the agents over one period
            while time.perf_counter() < end and not rd.done():
                seq += 1
                if period:
                    await asyncio.sleep(max(0.0, nxt - time.perf_counter()))
                    stamp, nxt = nxt, nxt + period
                else:
                    await credit.acquire()
                    stamp = time.perf_counter()
                if period:
                    await credit.acquire()
                sent[seq] = stamp
                d = agent_pb2.Delta(seq=seq, upserts=pre[seq % len(pre)])
                await call.write(agent_pb2.AgentMessage(delta=d).SerializeToString())
            done.set()
            for _ in range(1000):  # up to 10 s for the last acks
                if not sent or rd.done():
                    break
                await asyncio.sleep(0.01)
            rd.cancel()
            with contextlib.suppress(BaseException):
                await rd

        jobs = [one(k, i) for k, i in enumerate(agents)]
        c0 = time.process_time()
        t_start = max(start_at, time.time())
        await asyncio.gather(*jobs)
        wall = time.time() - t_start
        return {"n": acked[0], "wall_s": wall, "cpu_s": time.process_time() - c0, "lat": _thin(lat),
                "errors": errors[0], "storm_msgs": storm_msgs[0]}  # fmt: skip

    async def _storm(self, ch: grpc.aio.Channel, i: int, start_at: float, seconds: float, pre: list) -> int:
        """One storm agent for ``seconds`` (issue 18 "Bad input"): what the storm and hostile-input
        tests send, in a loop, each loop on a new stream with a new boot id -- by ``i % 4``: a
        reconnect loop (Hello + Snapshot, hang up), a replayed Delta seq then a seq gap (clusterd
        answers a resync error), a burst of 64 Deltas back to back, or 32 Deltas restating the same
        faults (duplicates: nothing changes). Returns the messages it sent."""
        node, sent, loop = f"storm-{i:05d}", 0, 0
        snap = agent_pb2.AgentMessage(snapshot=agent_pb2.Snapshot(seq=1, faults=pre[0])).SerializeToString()

        def delta(seq: int, v: int = 0) -> bytes:
            return agent_pb2.AgentMessage(delta=agent_pb2.Delta(seq=seq, upserts=pre[v])).SerializeToString()

        await _sleep_until(start_at)
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            loop += 1
            call = _stream(ch)

            async def send(msg: bytes, call=call) -> None:
                nonlocal sent
                await call.write(msg)
                sent += 1  # counted as written, also when a later read times out

            try:
                await send(hello_bytes(node, "noded", boot_id=f"storm-boot-{loop}"))
                await send(snap)
                await asyncio.wait_for(call.read(), 10)
                kind = i % 4
                if kind == 1:  # replay, then a gap: clusterd answers a resync error
                    for seq in (2, 2, 9):
                        await send(delta(seq))
                    for _ in range(3):
                        raw = await asyncio.wait_for(call.read(), 10)
                        if raw is grpc.aio.EOF or _ack_seq(raw)[1]:
                            break
                elif kind in (2, 3):  # a burst of changes / the same faults restated
                    n = 64 if kind == 2 else 32
                    for seq in range(2, n + 2):
                        await send(delta(seq, seq % len(pre) if kind == 2 else 0))
                    for _ in range(n):
                        await asyncio.wait_for(call.read(), 10)
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError, TimeoutError):
                pass  # an overloaded or refusing server: the storm goes on
            finally:
                call.cancel()
            await asyncio.sleep(0.05)
        return sent

    async def pubfault(
        self, addr: str, clients: list[int], start_at: float, seconds: float
    ) -> dict[str, Any]:
        """``clients`` concurrent SendPublicFault callers (16 per connection) for ``seconds``."""
        await self.close()
        self.channels = _channels(addr, (len(clients) + 15) // 16)
        lat: list[float] = []
        errors = [0]
        pre = [pubfault_bytes(c * 1_000_000 + j) for c in clients for j in range(4)]

        async def one(k: int) -> None:
            call = self.channels[k // 16].unary_unary(
                PUBFAULT, request_serializer=None, response_deserializer=None
            )
            j = 0
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                j += 1
                t = time.perf_counter()
                raw = await call(pre[(k * 4 + j) % len(pre)], timeout=10)
                lat.append(time.perf_counter() - t)
                errors[0] += pubfault_pb2.RespStatus.FromString(raw).code != 0

        await _sleep_until(start_at)
        c0, t0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(one(k) for k in range(len(clients))))
        return {"n": len(lat), "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0,
                "lat": _thin(lat), "errors": errors[0]}  # fmt: skip


async def _sleep_until(t_wall: float) -> None:
    await asyncio.sleep(max(0.0, t_wall - time.time()))


def _worker_main(conn) -> None:
    import uvloop

    async def serve() -> None:
        w = _Worker()
        loop = asyncio.get_running_loop()
        while True:
            job = await loop.run_in_executor(None, conn.recv)
            if job is None:
                await w.close()
                return
            name, kw = job
            try:
                res = await w.close() if name == "close" else await getattr(w, name)(**kw)
                conn.send(("ok", res))
            except Exception as e:  # report, keep serving
                conn.send(("error", repr(e)))

    uvloop.run(serve())


class Fleet:
    """``procs`` worker processes; :meth:`run` gives each a slice of ``items`` (agent or client indexes)
    and runs the job in all at once. Use as ``with Fleet(procs) as f:``."""

    def __init__(self, procs: int | None = None) -> None:
        self.procs = procs or default_procs()
        self._conns: list = []
        self._ps: list = []

    def __enter__(self) -> Fleet:
        ctx = mp.get_context("spawn")
        for _ in range(self.procs):
            a, b = ctx.Pipe()
            p = ctx.Process(target=_worker_main, args=(b,), daemon=True)
            p.start()
            self._conns.append(a)
            self._ps.append(p)
        return self

    def __exit__(self, *exc) -> None:
        for c in self._conns:
            try:
                c.send(None)
            except OSError:
                pass
        for p in self._ps:
            p.join(10)
            if p.is_alive():
                p.kill()

    def run(self, job: str, items: list[int], lead_s: float = 1.0, **kw: Any) -> dict[str, Any]:
        """Run ``job`` over ``items`` split across the workers, all starting ``lead_s`` s from now.
        Returns n (sum), wall_s (max), cpu_s (sum of the workers' CPU), lat (all samples, s),
        errors/retries (sums). Raises RuntimeError when a worker's job failed."""
        start_at = time.time() + lead_s
        parts = [items[k :: self.procs] for k in range(self.procs)]
        for c, part in zip(self._conns, parts, strict=True):
            args = dict(kw, start_at=start_at)
            if job != "resnap":  # resnap: the streams each worker holds
                args["clients" if job == "pubfault" else "agents"] = part
            c.send((job, args))
        out: dict[str, Any] = {"n": 0, "wall_s": 0.0, "cpu_s": 0.0, "lat": [], "errors": 0, "retries": 0}
        for c in self._conns:
            status, res = c.recv()
            if status != "ok":
                raise RuntimeError(f"load worker failed: {res}")
            out["n"] += res["n"]
            out["wall_s"] = max(out["wall_s"], res["wall_s"])
            out["cpu_s"] += res["cpu_s"]
            out["lat"] += res["lat"]
            out["errors"] += res.get("errors", 0)
            out["retries"] += res.get("retries", 0)
            out["storm_msgs"] = out.get("storm_msgs", 0) + res.get("storm_msgs", 0)
            out["matched"] = out.get("matched", 0) + res.get("matched", 0)
        return out

    def close_streams(self) -> None:
        """Close every worker's open streams and channels."""
        for c in self._conns:
            c.send(("close", {}))
        for c in self._conns:
            c.recv()


def quantile(xs: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``xs`` (0.0 when empty)."""
    if not xs:
        return 0.0
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


# -- the baseline peer ----------------------------------------------------------------------------
class EchoServer:
    """A trivial grpc.aio server in its own process, answering AgentStream/Connect with an Ack per
    Snapshot/Delta (``DIGEST_MATCH`` for a digest claim) and SendPublicFault with code 0: ``with EchoServer() as echo:`` (``echo.addr``,
    ``echo.pid``)."""

    def __init__(self) -> None:
        from benchkit import free_port

        self.addr = f"127.0.0.1:{free_port()}"
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> EchoServer:
        self.proc = subprocess.Popen([sys.executable, __file__, "--echo-server", self.addr])
        deadline = time.monotonic() + 20
        import socket

        while time.monotonic() < deadline:
            try:
                socket.create_connection(tuple(self.addr.rsplit(":", 1)), timeout=1).close()  # type: ignore[arg-type]
                return self
            except OSError:
                time.sleep(0.1)
        self.__exit__()
        raise TimeoutError("echo server not up")

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)

    @property
    def pid(self) -> int:
        """The server process id (for its CPU time)."""
        assert self.proc is not None
        return self.proc.pid


async def _echo(addr: str) -> None:
    ok = pubfault_pb2.RespStatus(code=0, info="ok").SerializeToString()

    async def connect(request_iterator, context):
        async for raw in request_iterator:
            m = agent_pb2.AgentMessage.FromString(raw)
            kind = m.WhichOneof("body")
            if kind == "hello" and m.hello.claim_seq:  # a claim in the Hello: matched too
                ack = agent_pb2.Ack(seq=m.hello.claim_seq, digest=agent_pb2.DIGEST_MATCH)
                yield agent_pb2.ControlMessage(ack=ack).SerializeToString()
            if kind in ("snapshot", "delta"):
                seq = getattr(m, kind).seq
                match = kind == "delta" and m.delta.snapshot_digest  # a claim: every one matches
                yield agent_pb2.ControlMessage(
                    ack=agent_pb2.Ack(seq=seq, digest=agent_pb2.DIGEST_MATCH if match else 0)
                ).SerializeToString()

    async def send(raw, context):
        pubfault_pb2.PublicFaultRequest.FromString(raw)
        return ok

    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 64 << 20)])
    server.add_generic_rpc_handlers((
        grpc.method_handlers_generic_handler("faultmesh.v1.AgentStream", {
            "Connect": grpc.stream_stream_rpc_method_handler(connect)}),
        grpc.method_handlers_generic_handler("PubFault", {
            "SendPublicFault": grpc.unary_unary_rpc_method_handler(send)}),
    ))  # fmt: skip
    server.add_insecure_port(addr)
    await server.start()
    await server.wait_for_termination()


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (from /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    """Resident memory of process ``pid`` in MiB (from /proc)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--echo-server":
        import uvloop

        uvloop.run(_echo(sys.argv[2]))
