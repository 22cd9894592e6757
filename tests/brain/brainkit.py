"""Helpers for the brain tests: job specs, faults, trainsims and waits (import as ``brain.brainkit``)."""

from __future__ import annotations

import asyncio
import contextlib

from faultmesh.model import Fault
from fmtools.trainsim import Outcomes, TrainSim

JOB = "job-0001-uid"
FAST = (
    "--report-timeout-s", "2.0",
    "--keepalive-s", "0.3",
    "--fault-flush-s", "0.01",
    "--hot-switch-wait-s", "0.5",
    "--scale-wait-s", "1.0",
    "--signal-send-s", "1.0",
    "--fault-retry-s", "1.0",
    "--hccl-route-s", "0.01",
    "--in-place-wait-s", "0.6",
    "--pre-exit-wait-s", "0.2",
    "--platform-wait-s", "1.5",
    "--job-wait-scale", "0.01",
    "--retry-hide-s", "0.2",
)  # fmt: skip


def job_spec(job_id: str = JOB, name: str = "llama", **over) -> dict:
    """Two nodes x 2 NPUs (ranks 0-3), backup node-c; recovery settings overridable."""
    spec = {
        "id": job_id,
        "name": name,
        "namespace": "default",
        "status": "running",
        "framework": "pytorch",
        "recover-strategy": "retry,recover,dump",
        "process-recover-enable": "on",
        "fault-scheduling": "grace",
        "subHealthyStrategy": "ignore",
        "backupNodes": ["node-c"],
        "ranks": [
            {"rank": 0, "node": "node-a", "device": 0, "superPodId": 0},
            {"rank": 1, "node": "node-a", "device": 1, "superPodId": 0},
            {"rank": 2, "node": "node-b", "device": 0, "superPodId": 0},
            {"rank": 3, "node": "node-b", "device": 1, "superPodId": 0},
        ],
    }
    spec.update(
        {
            k.replace("_", "-")
            if k in ("recover_strategy", "process_recover_enable", "fault_scheduling")
            else k: v
            for k, v in over.items()
        }
    )
    return spec


MINDIE = "mindie-svc-0001"  # a MindIE service's job id (the jobID label of its jobs)


def mindie_specs(mindie_id: str = MINDIE, pods_per_server: int = 1, servers: int = 2) -> list[dict]:
    """A MindIE service: a coordinator (node-c), a controller (node-d) and ``servers`` server
    instances of ``pods_per_server`` pods x 2 NPUs (nodes node-s<i>-<p>), every pod with its IPs."""
    specs = []
    for app, node, ip in (("coordinator", "node-c", 3), ("controller", "node-d", 4)):
        specs.append(
            {
                "id": f"{mindie_id}-{app}",
                "name": f"{mindie_id}-{app}",
                "jobID": mindie_id,
                "app": f"mindie-ms-{app}",
                "pods": [{"node": node, "podIp": f"172.16.0.{ip}", "hostIp": f"10.0.0.{ip}"}],
            }
        )
    for i in range(servers):
        nodes = [f"node-s{i}-{p}" for p in range(pods_per_server)]
        specs.append(
            {
                "id": f"{mindie_id}-server-{i}",
                "name": f"{mindie_id}-server-{i}",
                "jobID": mindie_id,
                "app": "mindie-ms-server",
                "deployServer": str(pods_per_server),
                "ranks": [
                    {"rank": p * 2 + d, "node": n, "device": d, "deviceIp": f"192.168.{i}.{p * 2 + d}"}
                    for p, n in enumerate(nodes)
                    for d in range(2)
                ],
                "pods": [
                    {"node": n, "podIp": f"172.16.{i + 1}.{p}", "hostIp": f"10.0.{i + 1}.{p}"}
                    for p, n in enumerate(nodes)
                ],
            }
        )
    return specs


async def apply_specs(cd, specs: list[dict]) -> list:
    """Apply raw job specs to ``cd``; returns the Jobs."""
    from clusterd.brain.jobs import parse_jobs

    return [job for job, _ in await cd.jobs.apply(parse_jobs(specs))]


async def apply(cd, **over):
    """Apply :func:`job_spec` (with overrides) to ``cd``; returns the Job."""
    from clusterd.brain.jobs import parse_job

    ((job, _),) = await cd.jobs.apply([parse_job(job_spec(**over))])
    return job


def npu_fault(node="node-b", dev=0, code="80E18402", level="RestartNPU", source="deviced") -> Fault:
    """An NPU fault record for the fault center."""
    return Fault(source=source, node=node, device_type="NPU", device_id=dev, code=code, level=level)


class Sims:
    """Start trainsims in the test's loop; all are stopped at teardown."""

    def __init__(self, target: str, token: str | None = None) -> None:
        self.target = target
        self.token = token  # ClusterD's bearer token, when it runs with --token-file
        self.running: list[tuple[TrainSim, asyncio.Task]] = []

    async def start(
        self, job_id: str = JOB, ranks_per_pod: int = 2, allow_errors: bool = False, **outcomes
    ) -> TrainSim:
        """A running trainsim for ``job_id`` (2 NPUs per pod as :func:`job_spec`). At teardown a
        sim that saw a signal the real TaskD / MindIO would reject fails the test, unless
        ``allow_errors``."""
        sim = TrainSim(
            self.target, job_id, Outcomes(**outcomes), token=self.token, ranks_per_pod=ranks_per_pod
        )
        sim.allow_errors = allow_errors
        ready = asyncio.Event()
        task = asyncio.create_task(sim.run(ready))
        done, _ = await asyncio.wait(
            [task, asyncio.ensure_future(ready.wait())], timeout=5, return_when="FIRST_COMPLETED"
        )
        if task in done:
            task.result()
        await asyncio.sleep(0.05)  # the subscription reset has run on the server
        self.running.append((sim, task))
        return sim

    async def close(self) -> None:
        for sim, task in self.running:
            sim.stop()
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(task, 5)
        errors = [e for sim, _ in self.running if not sim.allow_errors for e in sim.errors]
        assert not errors, f"trainsim (TaskD/MindIO) would break on: {errors}"


def decisions(cd, job_id: str = JOB) -> list[str]:
    """The decision names recorded for ``job_id``, oldest first."""
    return [d["decision"] for d in cd.brain.decisions.get(job_id, ())]


async def wait_decision(cd, decision: str, job_id: str = JOB, timeout_s: float = 10.0) -> dict:
    """Wait for a decision named ``decision``; returns its record."""
    async with asyncio.timeout(timeout_s):
        while True:
            for d in cd.brain.decisions.get(job_id, ()):
                if d["decision"] == decision:
                    return d
            await asyncio.sleep(0.02)


async def wait_idle(cd, job_id: str = JOB, timeout_s: float = 10.0) -> None:
    """Wait until the job's controller runs no flow."""
    ctl = cd.brain.controllers[job_id]
    async with asyncio.timeout(timeout_s):
        while ctl.busy():
            await asyncio.sleep(0.02)


def signals(sim) -> list[tuple[str, tuple[str, ...], str]]:
    """(signalType, actions, changeStrategy) of every signal the sim got."""
    return [(e["signalType"], tuple(e["actions"]), e["changeStrategy"]) for e in sim.signals()]


async def wait_state(cd, state: str, job_id: str = JOB, timeout_s: float = 5.0) -> None:
    """Wait until the job's controller is in ``state``."""
    ctl = cd.brain.controllers[job_id]
    async with asyncio.timeout(timeout_s):
        while ctl.state != state:
            await asyncio.sleep(0.01)


async def stuck_at_stop_complete(cd, sims):
    """An applied job's recovery stuck: a trainsim that never reports stop-complete, an NPU fault,
    the controller waiting in ``WaitReportStopComplete``. Returns the controller."""
    await sims.start(stop="silent")
    await cd.center.upsert(npu_fault())
    await wait_state(cd, "WaitReportStopComplete")
    return cd.brain.controllers[JOB]


async def expect_stop_train_dropped(sim: TrainSim, timeout_s: float = 5.0) -> None:
    """Wait until ``sim`` (as TaskD) drops a ``stopTrain``: its stop-train plugin still holds the
    previous flow's stopTrain (trainsim module docstring, stop_train.go). Asserts that this is the
    sim's only error and clears it (the test expects it)."""
    await sim.wait_for(lambda ev: sim.errors, timeout_s)
    assert all("stop-train plugin already forwarded" in e for e in sim.errors), sim.errors
    sim.errors.clear()


async def vanish_in(cd, sim, state: str, job_id: str = JOB):
    """The training side disappears while the controller is in ``state``: the controller must reset
    to INIT with no flow left. Returns the controller."""
    await wait_state(cd, state, job_id)
    await sim.close()
    d = await wait_decision(cd, "reset", job_id)
    assert d["reason"] == "signal stream ended"
    await wait_idle(cd, job_id)
    ctl = cd.brain.controllers[job_id]
    assert ctl.state == "INIT" and not ctl.busy()
    return ctl
