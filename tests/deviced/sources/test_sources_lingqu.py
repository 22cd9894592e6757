"""The lingqu switch source: a burst of switch events is bounded and resynced by a full query (§7)."""

from __future__ import annotations

from support import free_port

from deviced.app import DeviceD, build_parser
from deviced.backends import SimBackend


async def test_switch_event_burst_is_bounded_and_resynced():
    from deviced.app import SWITCH_QUEUE_MAX
    from faultmesh.dcmi.lingqu import SwitchEvent

    sim = SimBackend(1, 1)
    args = build_parser().parse_args(
        [
            "--node-name",
            "n",
            "--backend",
            "sim",
            "--clusterd",
            f"127.0.0.1:{free_port()}",
            "--probe-interval",
            "0",
        ]
    )
    app = DeviceD(args, sim)
    await app.init_backend()
    try:
        sim.switch.faults = [SwitchEvent(0x00F1FEF5, 155914, 1, 0, 2, 7, 2, 1, 1, 0, 0)]
        for i in range(SWITCH_QUEUE_MAX + 500):  # a burst from the lingqu thread
            app.lingqu.on_event(SwitchEvent(0x12345678, i, 1, 0, 0, 0, 2, 1, i, 0, 0))
        assert len(app.lingqu.queue) == SWITCH_QUEUE_MAX and app.switch_drops == 500
        await app.run_cycle()
        assert app.lingqu.queue == [] and not app.lingqu.resync_pending
        # the full query replaced the partial burst: the state is the library's current list
        assert [f.code for f in app.state.faults.values() if f.source == "lingqu"] == [
            "[0x00f1fef5,155914,npu,na]"
        ]
    finally:
        app.blocking.shutdown()
        app.probe_pool.shutdown()
