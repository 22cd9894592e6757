"""clusterd's own cost per agent-stream message, without gRPC (issue 18: "an unchanged snapshot
costs <= 1/10 of a changed one"; the over-gRPC figure of bench/clusterd_scale.py --resync is
dominated by the transport's own per-message cost, which this bench leaves out).

An in-process ClusterD (every component, state in a temp dir) serves N streams through
``AgentHub.Connect`` directly: each stream is an async generator of AgentMessage objects and its
acks are read from Connect's output, as grpc.aio would do, but with no serialization, no HTTP/2 and
no C core. Each agent says Hello and a deviced Snapshot (16 NPUs; every 10th node 10 NPU faults),
then, all streams at once, one message per phase:

- heartbeat: an empty Delta (the floor of any message);
- unchanged: the digest claim of the stored snapshot (acked DIGEST_MATCH);
- full: the same snapshot again in full (an unchanged resync before digests);
- changed: the snapshot with every NPU's health and every fault's level changed.

Per phase: CPU of this process (all threads: SQLite's included) per message, and the same phase
against an echo Connect (reads each message and yields its Ack: the plumbing floor this driver
costs), measured in the same run. The last line holds the figures, ``unchanged_vs_changed`` being
(unchanged - echo) / (changed - echo). ``--profile FILE`` writes a cProfile of the phases.

Run: ``.venv/bin/python bench/agent_inproc.py [--agents 1000] [--rounds 3]`` (under a minute).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import sys
import tempfile
import time
from pathlib import Path

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "services"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from loadgen import claim_bytes, node_name, snapshot_bytes  # noqa: E402

from faultmesh._pb import agent_pb2  # noqa: E402

PHASES = ("heartbeat", "unchanged", "full", "changed")


class _Context:
    """What AgentHub.Connect asks of a grpc.aio ServicerContext."""

    def __init__(self, i: int) -> None:
        self._peer = f"ipv4:127.0.0.1:{10000 + i}"

    def peer(self) -> str:
        return self._peer

    async def send_initial_metadata(self, metadata) -> None:
        pass

    async def abort(self, code, details):
        raise RuntimeError(f"aborted: {code} {details}")


class _Stream:
    """One agent: an inbox of AgentMessage objects and the acks read back."""

    def __init__(self) -> None:
        self.inbox: asyncio.Queue = asyncio.Queue()
        self.acks: asyncio.Queue = asyncio.Queue()

    async def messages(self):
        while True:
            m = await self.inbox.get()
            if m is None:
                return
            yield m


async def _echo(request_iterator, context):
    async for m in request_iterator:
        kind = m.WhichOneof("body")
        if kind in ("snapshot", "delta"):
            body = getattr(m, kind)
            match = agent_pb2.DIGEST_MATCH if kind == "delta" and body.snapshot_digest else 0
            yield agent_pb2.ControlMessage(ack=agent_pb2.Ack(seq=body.seq, digest=match))


async def _drive(connect, streams: list[_Stream], i: int) -> None:
    async for out in connect(streams[i].messages(), _Context(i)):
        if out.WhichOneof("body") == "ack":
            streams[i].acks.put_nowait(out.ack)


def _messages(n: int) -> dict[str, list]:
    """Per agent: the hello, the snapshot and one message per phase (AgentMessage objects)."""
    parse = agent_pb2.AgentMessage.FromString
    out: dict[str, list] = {k: [] for k in ("hello", "snapshot", *PHASES)}
    for i in range(n):
        node = node_name(i)
        faults = 10 if i % 10 == 0 else 0
        snap = snapshot_bytes(node, 16, faults, seq=1)
        out["hello"].append(agent_pb2.AgentMessage(hello=agent_pb2.Hello(node=node, agent="deviced")))
        out["snapshot"].append(parse(snap))
        out["heartbeat"].append(agent_pb2.AgentMessage(delta=agent_pb2.Delta(seq=2)))
        out["unchanged"].append(parse(claim_bytes(snap, 3)))
        out["full"].append(parse(snapshot_bytes(node, 16, faults, seq=4)))
        out["changed"].append(parse(snapshot_bytes(node, 16, faults, seq=5, changed=True)))
    return out


async def _phase(streams: list[_Stream], msgs: list) -> float:
    """Send one message on every stream, wait for every ack; CPU seconds of this process."""
    c0 = time.process_time()
    for s, m in zip(streams, msgs, strict=True):
        s.inbox.put_nowait(m)
    for s in streams:
        ack = await asyncio.wait_for(s.acks.get(), 60)
        if ack.error:
            raise RuntimeError(f"ack error: {ack.error}")
    return time.process_time() - c0


async def run(n: int, rounds: int, profile: str | None, phases: tuple = PHASES) -> dict[str, float]:
    from clusterd.app import ClusterD, _load_component_classes, build_parser, tune_gc

    tune_gc()  # the daemon's GC settings (clusterd.app.main), so the figures are the daemon's

    msgs = _messages(n)
    res: dict[str, list[float]] = {f"{w}_{p}": [] for w in ("cd", "echo") for p in PHASES}
    prof = cProfile.Profile() if profile else None
    for _ in range(rounds):
        with tempfile.TemporaryDirectory() as d:
            classes = _load_component_classes()
            args = build_parser(classes).parse_args(
                ["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--state-dir", d]
                + ["--agent-stale-after-s", "3600", "--log-level", "WARNING"]
            )
            cd = ClusterD(args, classes)
            await cd.start()
            gc.freeze()  # as the daemon after start
            try:
                for who, connect in (("cd", cd.agents.Connect), ("echo", _echo)):
                    streams = [_Stream() for _ in range(n)]
                    tasks = [asyncio.create_task(_drive(connect, streams, i)) for i in range(n)]
                    for s, h, sn in zip(streams, msgs["hello"], msgs["snapshot"], strict=True):
                        s.inbox.put_nowait(h)
                        s.inbox.put_nowait(sn)
                    for s in streams:
                        await asyncio.wait_for(s.acks.get(), 60)
                    for p in PHASES:
                        if prof and who == "cd" and p in phases:
                            prof.enable()
                        res[f"{who}_{p}"].append(await _phase(streams, msgs[p]))
                        if prof and who == "cd" and p in phases:
                            prof.disable()
                    for s in streams:
                        s.inbox.put_nowait(None)
                    await asyncio.wait_for(asyncio.gather(*tasks), 30)
            finally:
                await cd.stop()
    if prof:
        prof.dump_stats(profile)
    return {k: min(v) for k, v in res.items()}  # min: least disturbed by other load


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--agents", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3, help="fresh clusterds; the least is printed")
    ap.add_argument("--profile", default=None, help="write a cProfile of clusterd's phases here")
    ap.add_argument("--profile-phases", default=",".join(PHASES), help="the phases profiled")
    a = ap.parse_args(argv)
    r = uvloop.run(run(a.agents, a.rounds, a.profile, tuple(a.profile_phases.split(","))))
    us = {k: v / a.agents * 1e6 for k, v in r.items()}
    for p in PHASES:
        print(f"  {p:9} clusterd {us['cd_' + p]:6.1f} us/message | echo {us['echo_' + p]:5.1f} us | "
              f"clusterd's own {us['cd_' + p] - us['echo_' + p]:6.1f} us")  # fmt: skip

    def own(p: str) -> float:
        return max(us[f"cd_{p}"] - us[f"echo_{p}"], 1e-9)

    print(
        f"RESULT agents={a.agents} "
        + " ".join(f"{p}_us={us['cd_' + p]:.1f}" for p in PHASES)
        + f" unchanged_vs_changed={own('unchanged') / own('changed'):.2f}"
        f" heartbeat_vs_changed={own('heartbeat') / own('changed'):.2f}"
        f" full_vs_changed={own('full') / own('changed'):.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
