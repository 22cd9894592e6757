"""Platform mode (clusterd.md §7.1, §7.3): the recovery flow waits on the AI platform's annotations,
read and written by the platform over ClusterD's HTTP API (standalone mode)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import urllib.error
import urllib.request

import pytest
from brain.brainkit import JOB, apply, decisions, npu_fault, vanish_in, wait_decision, wait_idle


def _call(cd, body=None, job=JOB) -> tuple[int, dict]:
    url = f"http://{cd.http.host}:{cd.http.port}/v1/jobs/{job}/platform"
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    req = urllib.request.Request(url, data=data, method="GET" if data is None else "POST")
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


async def annotations(cd, body=None, job=JOB) -> tuple[int, dict]:
    """GET (no body) or POST the job's platform annotations, as the AI platform does."""
    return await asyncio.to_thread(_call, cd, body, job)


class PlatformSim:
    """The AI platform: answers ProcessConfirmFault with ``result`` and sets RankTableReady."""

    def __init__(self, cd, result: str | None = "", rank_table: str | None = "true") -> None:
        self.cd, self.result, self.rank_table = cd, result, rank_table
        self.confirmed: list[str] = []
        self.task: asyncio.Task | None = None

    async def run(self) -> None:
        while True:
            _, ann = await annotations(self.cd)
            c = ann.get("ProcessConfirmFault")
            if c and c not in self.confirmed:
                self.confirmed.append(c)
                change = {}
                if self.result is not None:
                    change["ProcessResultFault"] = self.result
                if self.rank_table is not None:
                    change["RankTableReady"] = self.rank_table
                if change:
                    await annotations(self.cd, change)
            await asyncio.sleep(0.05)

    async def __aenter__(self):
        self.task = asyncio.create_task(self.run())
        return self

    async def __aexit__(self, *exc):
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


async def test_platform_recover_happy_path(cd, sims):
    await apply(cd)
    assert await annotations(cd, {"ProcessRecoverStrategy": "recover"}) == (
        200,
        {"ProcessRecoverStrategy": "recover"},
    )
    await sims.start()
    async with PlatformSim(cd) as plat:
        await cd.center.upsert(npu_fault())
        await wait_decision(cd, "recover-success")
        await wait_idle(cd)
    assert decisions(cd) == [
        "pre-exit", "stop-train", "platform-strategy", "platform-confirmed", "recover", "recover-success"
    ]  # fmt: skip
    assert plat.confirmed == ["2:1"]  # the cached normal faults, before the pod expansion
    async with asyncio.timeout(5):
        while (await annotations(cd))[1].get("ProcessRecoverStatus") != "recover-success":
            await asyncio.sleep(0.05)


async def test_platform_retry_confirmed_then_retry(cd, sims):
    await apply(cd)
    await annotations(cd, {"ProcessRecoverStrategy": "retry"})
    sim = await sims.start()
    async with PlatformSim(cd) as plat:
        await cd.center.upsert(npu_fault(code="80E01801", level="RestartBusiness"))
        await wait_decision(cd, "retry-success")
    assert plat.confirmed == ["2:0"]
    assert sim.signals("globalFault")[0]["faultRanks"] == [("2", "0")]
    assert [s["changeStrategy"] for s in sim.signals("changeStrategy")] == ["retry"]


async def test_platform_result_with_a_normal_rank_turns_retry_into_the_normal_case(cd, sims):
    await apply(cd)
    await annotations(cd, {"ProcessRecoverStrategy": "retry"})
    sim = await sims.start()
    async with PlatformSim(cd, result="0:1"):
        await cd.center.upsert(npu_fault(code="80E01801", level="RestartBusiness"))
        await wait_decision(cd, "exit-completed")  # retry is all the platform allows: nothing else fits
    gf = sim.signals("globalFault")[0]
    assert gf["actions"] == ["on_global_rank", "fault_nodes_exit"] and gf["nodeRankIds"] == ["0", "1"]


async def test_platform_strategy_never_set_goes_to_fault_retry(cd, sims):
    await apply(cd)
    await annotations(cd, {"ProcessRecoverStrategy": ""})  # platform mode, the platform has not decided
    await sims.start()
    await cd.center.upsert(npu_fault())
    d = await wait_decision(cd, "fault-clear")
    assert d["reason"] == "platform strategy not set in 1.5s"
    await wait_decision(cd, "fault-retry")


async def test_platform_result_never_set_goes_to_fault_retry(cd, sims):
    await apply(cd)
    await annotations(cd, {"ProcessRecoverStrategy": "recover"})
    await sims.start()
    await cd.center.upsert(npu_fault())
    d = await wait_decision(cd, "fault-clear")
    assert d["reason"] == "ProcessResultFault not set in 1.5s"
    assert (await annotations(cd))[1]["ProcessConfirmFault"] == "2:1"


async def test_previous_confirmation_not_cleared_fails_the_flow(cd, sims):
    await apply(cd)
    await annotations(cd, {"ProcessRecoverStrategy": "recover", "ProcessConfirmFault": "9:1"})
    await sims.start()
    await cd.center.upsert(npu_fault())
    d = await wait_decision(cd, "fault-clear")
    assert d["reason"] == "platform did not clear the previous ProcessConfirmFault"


async def test_rank_table_not_ready_chooses_exit(cd, sims):
    await apply(cd)
    await annotations(cd, {"ProcessRecoverStrategy": "recover"})
    sim = await sims.start()
    async with PlatformSim(cd, rank_table="false"):
        await cd.center.upsert(npu_fault())
        await wait_decision(cd, "exit-completed")
    assert decisions(cd)[-3:] == ["rank-table-not-ready", "exit", "exit-completed"]
    # the signal is queued on TaskD's stream when the decision is recorded; the stand-in reads it after
    await sim.wait_for(lambda ev: sim.signals("changeStrategy"), timeout_s=10)
    assert [s["changeStrategy"] for s in sim.signals("changeStrategy")] == ["exit"]
    async with asyncio.timeout(5):
        while (await annotations(cd))[1].get("ProcessRecoverStatus") != "exit-completed":
            await asyncio.sleep(0.05)


async def test_platform_dump_dumps_at_once_and_keeps_dump_success(cd, sims):
    await apply(cd)
    await annotations(cd, {"ProcessRecoverStrategy": "dump"})
    sim = await sims.start()
    await cd.center.upsert(npu_fault())
    await wait_decision(cd, "exit-completed")
    await wait_idle(cd)
    assert "saveAndExit" in [s["signalType"] for s in sim.signals()]
    await asyncio.sleep(0.2)
    assert (await annotations(cd))[1]["ProcessRecoverStatus"] == "dump-success"


@pytest.mark.parametrize(
    ("strategy", "state", "result"),
    [
        ("", "WaitPlatformStrategy", ""),
        ("recover", "WaitPlatformResultFault", None),
        ("recover", "WaitRankTableReady", ""),
    ],
)
async def test_client_vanishing_while_waiting_for_the_platform_resets(cd, sims, strategy, state, result):
    await apply(cd)
    await annotations(cd, {"ProcessRecoverStrategy": strategy})
    sim = await sims.start()
    async with PlatformSim(cd, result=result, rank_table=None):  # the platform never finishes
        await cd.center.upsert(npu_fault())
        ctl = await vanish_in(cd, sim, state)
    assert ctl.plat_strategy == ""


async def test_platform_api_bad_input(cd):
    await apply(cd)
    assert (await annotations(cd, {"Nope": "x"}))[0] == 400
    assert (await annotations(cd, b"[1]"))[0] == 400
    assert (await annotations(cd, b"{not json"))[0] == 400
    assert (await annotations(cd, {"RankTableReady": 1}))[0] == 400
    assert (await annotations(cd, job="no-such-job"))[0] == 404
    assert await annotations(cd, {"RankTableReady": "true"}) == (200, {"RankTableReady": "true"})
    assert await annotations(cd, {"RankTableReady": None}) == (200, {})
