"""deviced stopped at any moment of its background startup (backend listing, sources starting,
first cycle) leaves nothing running: every source it started is stopped, and no cycle or table
reload is spawned after the stop (CI once found deviced's cycle and lingqu poll alive after
``stop()``, failing on the shut pools with "cannot schedule new futures after shutdown")."""

from __future__ import annotations

import asyncio

import pytest
from support import free_port

from deviced.app import DeviceD, build_parser
from deviced.backends import SimBackend
from faultmesh.runtime import TaskOwner


@pytest.mark.parametrize("delay_s", [0.0, 0.001, 0.005, 0.02, 0.05, 0.2])
async def test_stop_at_any_point_of_startup_leaves_no_task(delay_s):
    before = asyncio.all_tasks()
    args = build_parser().parse_args(
        ["--node-name", "n", "--backend", "sim", "--clusterd", f"127.0.0.1:{free_port()}",
         "--probe-interval", "0", "--http-addr", "127.0.0.1:0"]
    )  # fmt: skip
    app = DeviceD(args, SimBackend(1, 2))
    await app.start()
    await asyncio.sleep(delay_s)
    await app.stop()
    await asyncio.sleep(0)  # let the cancelled tasks' callbacks run (grpc.aio's own tasks end later)
    ours = [
        t for t in asyncio.all_tasks() - before if not type(t.get_coro()).__module__.startswith("_cython")
    ]
    left = {t.get_name() for t in ours if not t.done() and t is not asyncio.current_task()}
    assert left == set()


async def test_task_owner_close_cancels_what_a_closing_task_spawns():
    owner = TaskOwner("t")
    late: list[asyncio.Task] = []

    async def spawner() -> None:
        try:
            await asyncio.sleep(3600)
        finally:  # a cleanup that starts more work while being cancelled
            late.append(owner.spawn(asyncio.sleep(3600), name="late"))

    owner.spawn(spawner(), name="spawner")
    await asyncio.sleep(0)
    await owner.close(2.0)
    assert len(late) == 1 and late[0].cancelled()
    assert len(owner) == 0
