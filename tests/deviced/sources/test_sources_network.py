"""hccn_tool link state for chips without network codes (reference deviced.md §1 and §1.1)."""

from __future__ import annotations

import asyncio
import os

from support import free_port

from deviced.app import DeviceD, build_parser
from deviced.backends import SimBackend, hccn_link_up


def fake_tool(tmp_path, body: str):
    p = tmp_path / "hccn_tool"
    p.write_text("#!/bin/sh\n" + body + "\n")
    os.chmod(p, 0o755)
    return str(p)


def test_hccn_tool_output_parsing(tmp_path):
    assert hccn_link_up(str(tmp_path / "absent"), 0) is None
    assert hccn_link_up(fake_tool(tmp_path, 'echo "link status: UP"'), 0) is True
    assert hccn_link_up(fake_tool(tmp_path, 'echo "link status: DOWN"'), 3) is False
    assert hccn_link_up(fake_tool(tmp_path, "echo garbage"), 0) is None
    assert hccn_link_up(fake_tool(tmp_path, 'echo "link status: DOWN"; exit 1'), 0) is None  # failed: unknown
    tool = fake_tool(
        tmp_path, '[ "$2" = "5" ] && [ "$3" = "-link" ] && echo "link status: DOWN" || echo "link status: UP"'
    )
    assert hccn_link_up(tool, 5) is False and hccn_link_up(tool, 4) is True


async def test_silent_link_down_is_found_and_recovered():
    sim = SimBackend(1, 4)
    args = build_parser().parse_args(
        ["--node-name", "n", "--backend", "sim", "--clusterd", f"127.0.0.1:{free_port()}", "--probe-interval", "0",
         "--link-check-interval", "0.1"]
    )  # fmt: skip
    app = DeviceD(args, sim)
    await app.init_backend()
    try:
        await app.run_cycle()
        sim.link_silent(2, False)  # the linkdown event was lost
        await asyncio.sleep(0.15)
        await app.run_cycle()
        f = {(k.device_id, k.code): v for k, v in app.state.faults.items()}
        assert f[(2, "81078603")].level == "NotHandleFault"
        app.engine.mark_reinit(2)  # a mend poll must not clear it (the driver's list does not have it)
        await asyncio.sleep(0.15)
        await app.run_cycle()
        assert (2, "81078603") in {(k.device_id, k.code) for k in app.state.faults}
        sim.link_silent(2, True)
        await asyncio.sleep(0.15)
        await app.run_cycle()
        assert (2, "81078603") not in {(k.device_id, k.code) for k in app.state.faults}
        # a chip whose driver reports the link code itself is not checked
        sim.link(1, up=False)
        sim.link_silent(1, True)
        app.engine.mark_reinit(1)
        await asyncio.sleep(0.15)
        await app.run_cycle()
        assert (1, "81078603") in {(k.device_id, k.code) for k in app.state.faults}
    finally:
        app.blocking.shutdown()
        app.probe_pool.shutdown()
