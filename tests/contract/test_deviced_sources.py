"""Contract of deviced's sources (issue 12): for every entry of ``deviced.sources.SOURCES`` and each of
its simulators — the sim backend (deviced.backends.SimBackend, driven like deviced/simapi.py) and the
compiled test libraries (tests/native/dcmi_test_lib.c and lingqu_test_lib.c through the real ctypes
binding; nvml_test_lib.c through nvidia-ml-py for the nvml source) — the source starts, a fault raised in the simulator reaches the agent state, its recovery
clears it, and the source stops leaving no task behind.

Only the source under test runs: its own tasks (started by ``start(ctx)``) and its cycle hook, then
the engine's cycle and the report (the one place faults are built)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest
from native.build import build_libs
from native.ctl import Ctl
from native.nvml_ctl import LIB_NAME, NvmlCtl, build_nvml
from support import free_port

from deviced.app import DeviceD, build_parser
from deviced.backends import DcmiBackend, SimBackend
from deviced.sources import SOURCES
from faultmesh.source import SourceContext

CODE = 0x80E18008
SWITCH_CODE = "[0x00f1fef5,155914,npu,na]"


class Rig:
    """One simulator: ``raise_(source)`` / ``recover(source)`` make the source's fault appear / go."""

    def __init__(self, kind: str, tmp: Path, libs=None) -> None:
        self.kind = kind
        self.down = tmp / "links"
        self.down.mkdir()
        tool = tmp / "hccn_tool"  # fake hccn_tool: DOWN for the phy ids with a file in links/
        tool.write_text(
            f'#!/bin/sh\n[ -f {self.down}/$2 ] && echo "link status: DOWN" || echo "link status: UP"\n'
        )
        os.chmod(tool, 0o755)
        self.flags = ["--hccn-tool", str(tool)]
        if kind == "sim":
            self.sim = SimBackend(1, 8)
            self.backend = self.sim
        elif kind == "nvml-test-lib":  # deviced --backend nvml over tests/native/nvml_test_lib.c
            from deviced.nvml import NvmlBackend

            self.nvml = NvmlCtl.create(tmp / "nvml.ctl", ngpu=4)
            os.environ.update(self.nvml.env())
            self.backend = NvmlBackend(lib_path=str(libs / LIB_NAME))
            self.flags = ["--nvml-poll-interval", "0"]
        else:
            self.ctl = Ctl(libs)
            self.ctl.reset(2, 4)
            self.ctl.lq_reset()
            self.backend = DcmiBackend(str(libs.dcmi), str(libs.lingqu), hccn_tool=str(tool))

    def close(self) -> None:
        if self.kind == "dcmi-test-lib":
            self.ctl.reset(2, 4)
            self.ctl.lq_reset()

    def act(self, source: str, up: bool) -> None:
        """Raise (``up`` False: the fault) or recover the fault that ``source`` detects."""
        sim = self.kind == "sim"
        if source == "card-drop":
            if sim:
                self.sim.card(2, not up)
            else:
                self.ctl.set_rc(b"dcmi_get_device_health", 2, 0 if up else -8012)
        elif source == "chip-events":
            if sim:
                self.sim.inject(0, CODE, 0 if up else 1)
            else:
                assert self.ctl.fire(0, CODE, 0 if up else 1, 2, 1, 0) == 0
        elif source == "link-check":
            f = self.down / "2"
            if up:
                f.unlink()
            else:
                f.touch()
            if sim:
                self.sim.link_silent(2, up)
        elif source == "gateway-probe":
            if sim:
                self.sim.probe(3, 0 if up else 3)
            else:
                self.ctl.set_network(3, 0 if up else 3)
        elif source == "nvml":  # the NVML test library: a row remap pending on GPU 1
            self.nvml.gpu(1).remap_pending = 0 if up else 1
        elif source == "lingqu":
            if sim:
                self.sim.switch.fire(0x00F1FEF5, 155914, 1, 0, 2, 7, 2, 0 if up else 1)
            else:
                assert self.ctl.lq_fire(0x00F1FEF5, 155914, 1, 0, 2, 7, 2, 0 if up else 1, 1) == 0
        else:  # pragma: no cover - the completeness check below names it
            raise AssertionError(f"no scenario for source {source}")


EXPECT = {  # source name -> (agent-state source, device id, code) of the fault it raises
    "card-drop": ("dcmi", 2, "40F84E00"),
    "chip-events": ("dcmi", 0, "80E18008"),
    "link-check": ("dcmi", 2, "81078603"),
    "gateway-probe": ("dcmi", 3, "181078603"),
    "lingqu": ("lingqu", 2, SWITCH_CODE),
    "nvml": ("dcmi", 1, "4E5600010005"),  # remap-pending of the NVIDIA table
}


def test_every_source_has_a_scenario():
    assert {cls.name for cls in SOURCES} == set(EXPECT)


@pytest.fixture(scope="module")
def libs():
    try:
        return build_libs()
    except FileNotFoundError as e:
        pytest.skip(str(e))


async def until(pred, step, timeout_s: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        await step()
        if pred():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def nvml_lib():
    pytest.importorskip("pynvml")
    try:
        return build_nvml()
    except FileNotFoundError as e:
        pytest.skip(str(e))


BACKEND = {"sim": "sim", "dcmi-test-lib": "dcmi", "nvml-test-lib": "nvml"}
LIBS = {"dcmi-test-lib": "libs", "nvml-test-lib": "nvml_lib"}


@pytest.mark.parametrize("kind", ["sim", "dcmi-test-lib", "nvml-test-lib"])
@pytest.mark.parametrize("cls", SOURCES, ids=[c.name for c in SOURCES])
async def test_source_start_raise_recover_stop(cls, kind, tmp_path, request):
    if (cls.name == "nvml") != (kind == "nvml-test-lib"):
        pytest.skip("the nvml source runs with --backend nvml only, and alone there")
    libs = request.getfixturevalue(LIBS[kind]) if kind in LIBS else None
    rig = Rig(kind, tmp_path, libs)
    args = build_parser().parse_args(
        ["--node-name", "n", "--backend", BACKEND[kind], "--clusterd", f"127.0.0.1:{free_port()}",
         "--probe-interval", "0.1", "--link-check-interval", "0.05", *rig.flags]
    )  # fmt: skip
    app = DeviceD(args, rig.backend)
    src = next(s for s in app.sources if type(s) is cls)
    ctx = SourceContext(src.name, "n", app.state, app.io.pool, args, app.registry, app.source_metrics)
    await app.init_backend()
    try:
        assert src.supported().ok, src.supported().reason
        await src.start(ctx)
        if cls.name == "card-drop":
            app.engine.set_subscription(True)  # the card-drop check runs while events come by subscription

        async def step() -> None:
            await src.on_cycle()
            app.engine.cycle()
            app.report()

        source, dev, code = EXPECT[cls.name]

        def seen() -> bool:
            return any(
                (k.source, k.device_id, k.code) == (source, dev, code) and "recovered" not in f.attributes
                for k, f in app.state.faults.items()
            )

        await step()
        if cls.name == "lingqu":  # init and subscription run in the source's own task
            await until(lambda: src.subscribed, step, what="switch subscription")
        assert not seen()
        rig.act(cls.name, up=False)
        await until(seen, step, what=f"{cls.name} raise")
        rig.act(cls.name, up=True)
        await until(lambda: not seen(), step, what=f"{cls.name} recover")
        await src.stop()
        await ctx.close()
        assert len(ctx.tasks) == 0
    finally:
        await ctx.close()
        app.io.shutdown()
        rig.close()
