"""``promtool check metrics`` on a live scrape of each daemon (issue 8 "Chart checks"), and the alert
rules of the chart only use metrics the daemons really export.

clusterd runs in Kubernetes mode against kmock's API emulator (so the kube metrics and the per-node
health gauges are in the scrape), noded without a BMC and deviced on its simulated backend, all as
real processes on free loopback ports, stopped by PID.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import sys
import time
from pathlib import Path

import aiohttp
import pytest
import yaml
from support import free_port

from faultmesh import gojson

kmock = pytest.importorskip("kmock", reason="kmock not installed (pip install '.[dev]')")
RULES = Path(__file__).resolve().parents[2] / "charts" / "faultmesh" / "files" / "prometheus-rules.yaml"


async def _spawn(module: str, *args: str, log: Path) -> asyncio.subprocess.Process:
    f = open(log, "wb")  # noqa: ASYNC230 (a local log file, closed in _stop)
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", module, *args, stdout=f, stderr=f)
    proc._log = f  # type: ignore[attr-defined]
    return proc


async def _stop(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 15)
        except TimeoutError:
            proc.kill()
            await proc.wait()
    proc._log.close()  # type: ignore[attr-defined]


async def _scrape(
    session: aiohttp.ClientSession, url: str, must_contain: str = "", timeout_s: float = 20
) -> str:
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        try:
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=2)) as r:
                if r.status == 200:
                    last = await r.text()
                    if must_contain in last:
                        return last
        except (aiohttp.ClientError, TimeoutError):
            pass
        await asyncio.sleep(0.2)
    pytest.fail(f"{url} never served {must_contain!r}; last scrape:\n{last[:2000]}")


async def _promtool_check(promtool: str, text: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        promtool,
        "check",
        "metrics",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(text.encode()), 60)
    return proc.returncode, out.decode()


def _metric_names(text: str) -> set[str]:
    return set(re.findall(r"^# TYPE (\S+) ", text, re.M))


async def test_daemon_metrics_pass_promtool_and_feed_the_alert_rules(tmp_path):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (apt-get install prometheus)")
    grpc_addr = f"127.0.0.1:{free_port()}"
    urls = {name: f"127.0.0.1:{free_port()}" for name in ("clusterd", "noded", "deviced")}
    async with kmock.KubernetesEmulator() as emu, kmock.Server(emu) as srv:
        emu.resources["v1/configmaps"] = {}
        emu.resources["v1/nodes"] = {}
        emu.objects[(kmock.resource("v1/nodes"), None, "node-1")] = {"metadata": {"name": "node-1"}}
        info = {
            "FaultDevList": [
                {
                    "DeviceType": "Disk",
                    "DeviceId": 1,
                    "FaultCode": ["2C000031"],
                    "FaultLevel": "SeparateFault",
                }
            ],
            "NodeStatus": "UnHealthy",
        }
        nodeinfo = {
            "NodeInfo": json.dumps(
                {"NodeInfo": info, "CheckCode": gojson.check_code(gojson.canon_node_info(info))}
            )
        }
        emu.objects[(kmock.resource("v1/configmaps"), "mindx-dl", "mindx-dl-nodeinfo-node-1")] = {
            "metadata": {
                "name": "mindx-dl-nodeinfo-node-1",
                "namespace": "mindx-dl",
                "labels": {"mx-consumer-cim": "true"},
            },
            "data": nodeinfo,
        }
        procs = [
            await _spawn(
                "clusterd",
                "--grpc-addr",
                grpc_addr,
                "--http-addr",
                urls["clusterd"],
                "--state-dir",
                str(tmp_path / "state"),
                "--kube",
                "--kube-api",
                str(srv.url).rstrip("/"),
                "--kube-min-write-s",
                "0.05",
                log=tmp_path / "clusterd.log",
            ),
            await _spawn(
                "noded",
                "--node-name",
                "node-1",
                "--clusterd",
                grpc_addr,
                "--http-addr",
                urls["noded"],
                "--pingmesh-backend",
                "off",
                log=tmp_path / "noded.log",
            ),
            await _spawn(
                "deviced",
                "--node-name",
                "node-1",
                "--clusterd",
                grpc_addr,
                "--backend",
                "sim",
                "--http-addr",
                urls["deviced"],
                log=tmp_path / "deviced.log",
            ),
        ]
        try:
            async with aiohttp.ClientSession() as session:
                scrapes = {
                    "clusterd": await _scrape(
                        session,
                        f"http://{urls['clusterd']}/metrics",
                        'faultmesh_node_unhealthy{node="node-1"} 1.0',
                    ),
                    "noded": await _scrape(
                        session, f"http://{urls['noded']}/metrics", "faultmesh_agent_connected 1.0"
                    ),
                    "deviced": await _scrape(
                        session, f"http://{urls['deviced']}/metrics", "faultmesh_agent_connected 1.0"
                    ),
                }
            for name, text in scrapes.items():
                rc, out = await _promtool_check(promtool, text)
                assert rc == 0, f"{name}: promtool check metrics:\n{out}"
                # issue 17: process_* and build_info on every daemon, no *_created series
                assert "\nprocess_cpu_seconds_total " in text, name
                assert re.search(rf'^faultmesh_build_info{{.*service="{name}".*}} 1.0$', text, re.M), name
                assert "_created" not in text, name
        finally:
            for p in procs:
                await _stop(p)
    exported = set().union(*(_metric_names(t) for t in scrapes.values()))
    rules = yaml.safe_load(RULES.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            used = set(re.findall(r"\b(faultmesh_[a-z_]+)", rule["expr"]))
            assert used or re.match(r"max by \(job, instance\) \(up\{", rule["expr"]), rule["alert"]
            # Counters are declared as "<name>" in TYPE and exported as "<name>_total".
            missing = {m for m in used if m not in exported and m.removesuffix("_total") not in exported}
            assert not missing, f"{rule['alert']} uses metrics no daemon exports: {missing}"
