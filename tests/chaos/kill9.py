"""kill -9 rounds with storage faults mixed in (issue 19): the harness of tests/chaos and bench/chaos_kill9.py.

Each round starts a real ``clusterd`` on the same state dir (short busy timeout), then runs at once:
PubFault senders (each faultId retried until answered 0, which is the ack), one agent per node
(AgentClient, faults added while the round runs) and a *lock holder*: a second SQLite connection that
takes the write lock for longer than the busy timeout every so often, so commits fail while load is
on. At a random moment of the round the agents stop changing, wait until ClusterD acked their state,
and clusterd is killed with SIGKILL while the senders and the lock holder still run. The next
ClusterD must hold every acked public fault and exactly each agent's acked state.
"""

from __future__ import annotations

import asyncio
import random
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from support import ClusterdProcess, public_request

from faultmesh._pb import pubfault_pb2_grpc
from faultmesh.agent import AgentClient, AgentState
from faultmesh.model import Fault

BUSY_TIMEOUT_MS = 100
FLAGS = (
    "--state-busy-timeout-ms",
    str(BUSY_TIMEOUT_MS),
    "--public-fault-qps",
    "100000",
    "--public-fault-burst",
    "100000",
)


@dataclass
class Tally:
    """What the rounds acked, what the next ClusterD lacked, and how many writes failed meanwhile."""

    acked_public: set[str] = field(default_factory=set)
    lost_public: set[str] = field(default_factory=set)
    agent_faults_acked: int = 0
    agent_faults_lost: int = 0
    agent_faults_extra: int = 0
    refused_writes: int = 0  # PubFault answers other than 0 (599 while the lock was held, ...)
    rounds: int = 0


def _lock_holder(db: Path, stop: threading.Event, hold_s: float, every_s: float) -> None:
    while not stop.wait(every_s):
        try:
            conn = sqlite3.connect(db, timeout=2, isolation_level=None)
            conn.execute("BEGIN IMMEDIATE")
            stop.wait(hold_s)
            conn.execute("ROLLBACK")
            conn.close()
        except sqlite3.Error:
            pass  # clusterd held it itself, or was killed mid-transaction: try again later


def _sender(target: str, prefix: str, stop: threading.Event, tally: Tally, lock: threading.Lock) -> None:
    with grpc.insecure_channel(target) as ch:
        stub = pubfault_pb2_grpc.PubFaultStub(ch)
        i = 0
        while not stop.is_set():
            fid = f"{prefix}-{i:06d}"
            while not stop.is_set():  # retry the same faultId until it is acked
                try:
                    code = stub.SendPublicFault(public_request(fid, node="node-pub"), timeout=2).code
                except grpc.RpcError:
                    code = -1
                if code == 0:
                    with lock:
                        tally.acked_public.add(fid)
                    break
                with lock:
                    tally.refused_writes += 1
                time.sleep(0.01)
            i += 1


def _agent_fault(node: str, i: int) -> Fault:
    return Fault(
        source="bmc-oem", node=node, device_type="Memory", device_id=i, code=f"{i:08X}", level="SeparateFault"
    )


async def _agents_round(
    target: str, states: dict[str, AgentState], busy_s: float, rng: random.Random
) -> None:
    clients = [AgentClient(target, node, "noded", state=st, backoff_max_s=0.3) for node, st in states.items()]
    for c in clients:
        await c.start()
    deadline = time.monotonic() + busy_s
    n = 0
    while time.monotonic() < deadline:  # change the agents' truth while commits fail now and then
        for c in clients:
            st = c.state
            if st.faults and rng.random() < 0.3:
                st.remove(rng.choice(list(st.faults)))
            st.upsert(_agent_fault(st.node, rng.randrange(64)))
        n += 1
        await asyncio.sleep(0.02)
    for c in clients:  # every agent's state acked before the kill
        await c.wait_synced(20.0)
    for c in clients:
        c._stopping = True
        await c._tasks.close()  # no drain: clusterd is killed under a live stream


def run_rounds(workdir: Path, rounds: int = 3, load_s: float = 3.0, agents: int = 2, seed: int = 19) -> Tally:
    """Run ``rounds`` kill -9 rounds of about ``load_s`` s each under storage faults; returns the tally."""
    rng = random.Random(seed)
    state = workdir / "state"
    tally = Tally()
    states = {f"node-{k}": AgentState(f"node-{k}") for k in range(agents)}
    lock = threading.Lock()
    for r in range(rounds):
        cd = ClusterdProcess(state, list(FLAGS), log_path=workdir / "clusterd.log").start()
        try:
            stop = threading.Event()
            threads = [
                threading.Thread(target=_sender, args=(cd.grpc, f"r{r}s{s}", stop, tally, lock), daemon=True)
                for s in range(2)
            ]
            threads.append(
                threading.Thread(
                    target=_lock_holder,
                    args=(state / "clusterd.db", stop, 3 * BUSY_TIMEOUT_MS / 1000, 0.4),
                    daemon=True,
                )
            )
            for t in threads:
                t.start()
            asyncio.run(_agents_round(cd.grpc, states, load_s * rng.uniform(0.5, 1.0), rng))
            cd.kill9()  # senders and the lock holder still running
            stop.set()
            for t in threads:
                t.join(10)
        finally:
            cd.stop()
        tally.rounds += 1
        _check(ClusterdProcess(state, list(FLAGS), log_path=workdir / "clusterd.log"), states, tally)
    return tally


def _check(cd: ClusterdProcess, states: dict[str, AgentState], tally: Tally) -> None:
    cd.start()
    try:
        faults = cd.get_json("/v1/faults")
    finally:
        cd.stop()
    public = {f["attributes"].get("faultId") for f in faults if f["source"].startswith("public:")}
    tally.lost_public |= tally.acked_public - public
    for node, st in states.items():
        want = {(f.device_id, f.code) for f in st.faults.values()}
        have = {(f["device_id"], f["code"]) for f in faults if f["node"] == node}
        tally.agent_faults_acked += len(want)
        tally.agent_faults_lost += len(want - have)
        tally.agent_faults_extra += len(have - want)
