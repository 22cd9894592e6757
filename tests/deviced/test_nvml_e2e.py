"""``deviced --backend nvml`` (separate process) against the NVML test double (tests/native/nvml_test_lib.c,
loaded by nvidia-ml-py's own lookup through LD_LIBRARY_PATH) reporting to the real clusterd (issue 33):
XID 79 on GPU 3 at the table's level, its recovery, a hanging NVML call, a lost GPU, an event storm, an
unknown XID, events unsupported (polling), and a missing library."""

from __future__ import annotations

import re
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from native.nvml_ctl import XID_EVENT, NvmlCtl, build_nvml
from support import free_port, http_call, start_logged, stop_proc, wait_for

from deviced.nvml_table import NvidiaTable, xid_code

pytest.importorskip("pynvml")

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
TABLE = NvidiaTable.load()
X79, X48, X31 = (TABLE.codes.spelling(xid_code(x)) for x in (79, 48, 31))
LOST = TABLE.codes.spelling(TABLE.conditions["gpu-lost"])
REMAP = TABLE.codes.spelling(TABLE.conditions["remap-pending"])


@pytest.fixture(scope="module")
def libdir() -> Path:
    try:
        return build_nvml()
    except FileNotFoundError as e:
        pytest.skip(str(e))


start, stop = start_logged, stop_proc


def metric(port: int, name: str, labels: str = "") -> float | None:
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    except OSError:
        return None
    m = re.search(rf"^{re.escape(name)}{re.escape(labels)} (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def deviced_cmd(grpc_port: int, http_port: int, *extra: str) -> list[str]:
    return [
        str(BIN / "deviced"), "--node-name", "gpu-node", "--clusterd", f"127.0.0.1:{grpc_port}",
        "--backend", "nvml", "--http-addr", f"127.0.0.1:{http_port}", "--nvml-poll-interval", "0.3",
        "--dcmi-timeout", "1", "--list-watch-period", "3", *extra,
    ]  # fmt: skip


def test_xid79_lost_gpu_hang_and_storm_reach_clusterd(tmp_path, libdir):
    ctl = NvmlCtl.create(tmp_path / "nvml.ctl", ngpu=8)
    grpc_port, api_port, dv_port = free_port(), free_port(), free_port()
    cd = start(
        [str(BIN / "clusterd"), "--grpc-addr", f"127.0.0.1:{grpc_port}", "--http-addr",
         f"127.0.0.1:{api_port}", "--state-dir", str(tmp_path / "state")],
        tmp_path / "clusterd.log",
    )  # fmt: skip
    dv = start(
        deviced_cmd(grpc_port, dv_port, "--callback-rate-limit", "600"),
        tmp_path / "deviced.log",
        {"LD_LIBRARY_PATH": str(libdir), **ctl.env()},
    )
    api = f"http://127.0.0.1:{api_port}"

    def faults():
        status, body = http_call("GET", f"{api}/v1/faults")
        if status != 200:
            return {}
        return {(f["device_id"], f["code"]): f for f in body if f["node"] == "gpu-node"}

    try:
        wait_for(lambda: metric(dv_port, "faultmesh_deviced_subscribed") == 1.0, what="XID subscription")
        wait_for(lambda: metric(dv_port, "faultmesh_source_up", '{source="nvml"}') == 1.0, what="nvml up")
        wait_for(lambda: "gpu-node" in str(http_call("GET", f"{api}/v1/nodes")[1]), what="node in clusterd")
        status, gpus = http_call("GET", f"http://127.0.0.1:{dv_port}/v1/gpus")  # the GPUs' identity
        assert status == 200 and len(gpus["gpus"]) == 8 and gpus["driver_version"] == "550.0-faultmesh-test"
        g3 = gpus["gpus"][3]
        assert g3["uuid"].startswith("GPU-") and g3["pci_bus_id"] == "00000000:1B:00.0" and g3["serial"]
        assert g3["nvlinks"] == [0, 1, 2, 3] and g3["xid_events_armed"] and not g3["lost"]
        # XID 79 on GPU 3: the GPU fell off the bus, every call for it answers GPU_IS_LOST
        ctl.gpu(3).lost = 1
        t0 = time.monotonic()
        ctl.fire(3, XID_EVENT, 79)
        got = wait_for(lambda: (f := faults()) and (3, X79) in f and f, what="XID 79 in clusterd")
        latency = time.monotonic() - t0
        print(f"XID 79 -> clusterd: {latency * 1000:.0f} ms")
        assert latency < 5.0  # the goal is 1 s (fast fault path); a loaded CI box gets slack
        assert got[(3, X79)]["level"] == "SeparateNPU" and got[(3, X79)]["source"] == "dcmi"
        lost = wait_for(lambda: faults().get((3, LOST)), what="gpu-lost condition")
        assert lost["level"] == "SeparateNPU"
        assert http_call("GET", f"http://127.0.0.1:{dv_port}/v1/gpus")[1]["gpus"][3]["lost"] is True
        assert not any(dev != 3 for dev, _ in faults())  # the other GPUs stay clean
        # the GPU comes back (reset): XID 79 and gpu-lost recover
        ctl.gpu(3).lost = 0
        wait_for(lambda: not any(dev == 3 for dev, _ in faults()), what="GPU 3 recovered")

        # a hanging NVML call: the poll times out, the source goes down, events still flow
        ctl.hang("nvmlDeviceGetTemperature", 4000)
        wait_for(lambda: metric(dv_port, "faultmesh_source_up", '{source="nvml"}') == 0.0, what="nvml down")
        ctl.fire(5, XID_EVENT, 48)
        got = wait_for(lambda: (f := faults()) and (5, X48) in f and f, what="XID 48 during the hang")
        assert got[(5, X48)]["level"] == "RestartNPU"
        ctl.hang("", 0)
        wait_for(
            lambda: metric(dv_port, "faultmesh_source_up", '{source="nvml"}') == 1.0, what="nvml up again"
        )

        # an unknown XID: the default level, counted
        ctl.fire(6, XID_EVENT, 4242)
        wait_for(lambda: metric(dv_port, "faultmesh_deviced_nvml_unknown_xids_total") == 1.0, what="unknown")

        # a storm of 3000 XID 31 events: bounded by the token bucket (600/min), counted, deviced answers
        for k in range(3000):
            ctl.fire(k % 8, XID_EVENT, 31)
        wait_for(lambda: ctl.consumed() >= ctl.c.ev_head, what="storm consumed")
        drops = wait_for(
            lambda: (v := metric(dv_port, "faultmesh_deviced_callback_drops_total", '{kind="chip"}')) and v,
            what="storm drops",
        )
        assert 2000 <= drops <= 3000
        assert faults().get((5, X48), {}).get("level") == "RestartNPU"  # state kept through the storm
        assert dv.poll() is None and cd.poll() is None
    finally:
        stop(dv)
        stop(cd)
    log = (tmp_path / "deviced.log").read_text()
    assert "nvml xid subscription armed" in log
    assert log.count("nvml xid not in table") == 1


def test_events_unsupported_fall_back_to_polling(tmp_path, libdir):
    ctl = NvmlCtl.create(tmp_path / "nvml.ctl", ngpu=2)
    for i in range(2):
        ctl.gpu(i).events_unsupported = 1
    dv_port = free_port()
    dv = start(
        deviced_cmd(free_port(), dv_port),
        tmp_path / "deviced.log",
        {"LD_LIBRARY_PATH": str(libdir), **ctl.env()},
    )
    try:
        wait_for(
            lambda: "fault get mode downgrade" in (tmp_path / "deviced.log").read_text(), what="downgrade"
        )
        ctl.gpu(1).remap_pending = 1

        def codes():
            status, body = http_call("GET", f"http://127.0.0.1:{dv_port}/v1/devices")
            return {c["code"]: c["level"] for c in body["devices"][1]["codes"]} if status == 200 else {}

        assert wait_for(lambda: codes().get(REMAP), what="remap-pending by polling") == "FreeRestartNPU"
        assert metric(dv_port, "faultmesh_deviced_subscribed") == 0.0
    finally:
        stop(dv)


def test_missing_library_is_logged_once_and_deviced_runs(tmp_path, libdir):
    dv_port = free_port()
    env = {"LD_LIBRARY_PATH": str(tmp_path)}  # no libnvidia-ml.so.1 there
    dv = start(deviced_cmd(free_port(), dv_port), tmp_path / "deviced.log", env)
    try:
        wait_for(
            lambda: (metric(dv_port, "faultmesh_deviced_dcmi_errors_total", '{call="init",reason="LibraryMissing"}')
                     or 0) >= 2,
            timeout_s=30, what="two failed inits",
        )  # fmt: skip
        status, _ = http_call("GET", f"http://127.0.0.1:{dv_port}/v1/devices")
        assert status == 200 and dv.poll() is None
    finally:
        stop(dv)
    log = (tmp_path / "deviced.log").read_text()
    assert log.count("dcmi unavailable") == 1 and "libnvidia-ml.so.1" in log
