"""One live scrape of every faultmesh daemon, shared by the chart's metric checks (issues 8, 17).

clusterd runs in Kubernetes mode against kmock's API emulator (so the kube metrics and the per-node
health gauges are in the scrape), noded without a BMC and deviced on its simulated backend, all as
real processes on free loopback ports, stopped by PID. :func:`scrape_all` returns
``{"clusterd": text, "noded": text, "deviced": text}`` (the Prometheus text format of each).
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time
from pathlib import Path

import aiohttp
from support import free_port

from faultmesh import gojson

DAEMONS = ("clusterd", "noded", "deviced")


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
    raise AssertionError(f"{url} never served {must_contain!r}; last scrape:\n{last[:2000]}")


def metric_names(text: str) -> set[str]:
    """The metric family names declared (``# TYPE``) in a scrape."""
    return set(re.findall(r"^# TYPE (\S+) ", text, re.M))


def exported(scrapes: dict[str, str]) -> set[str]:
    """Every series name a scrape can hold: the family names plus a counter's ``_total`` and a
    histogram's ``_bucket`` / ``_sum`` / ``_count``."""
    out: set[str] = set()
    for text in scrapes.values():
        for name, kind in re.findall(r"^# TYPE (\S+) (\S+)", text, re.M):
            out.add(name)
            if kind == "counter":
                out.add(name + "_total")
            elif kind in ("histogram", "summary"):
                out.update(name + s for s in ("_bucket", "_sum", "_count"))
    return out


async def scrape_all(tmp_path: Path, kmock) -> dict[str, str]:
    """Start clusterd (kube mode on kmock), noded and deviced; scrape each once it is connected."""
    grpc_addr = f"127.0.0.1:{free_port()}"
    urls = {name: f"127.0.0.1:{free_port()}" for name in DAEMONS}
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
        # fmt: off
        procs = [
            await _spawn(
                "clusterd", "--grpc-addr", grpc_addr, "--http-addr", urls["clusterd"],
                "--state-dir", str(tmp_path / "state"), "--kube", "--kube-api", str(srv.url).rstrip("/"),
                "--kube-min-write-s", "0.05", log=tmp_path / "clusterd.log",
            ),
        ]
        try:
            async with aiohttp.ClientSession() as session:
                # the agents start once clusterd serves: started with it, they back off (0.5 s
                # doubling) through its start-up and connected seconds after it was ready
                await _scrape(session, f"http://{urls['clusterd']}/readyz")
                procs += [
                    await _spawn(
                        "noded", "--node-name", "node-1", "--clusterd", grpc_addr, "--http-addr", urls["noded"],
                        "--pingmesh-backend", "off", log=tmp_path / "noded.log",
                    ),
                    await _spawn(
                        "deviced", "--node-name", "node-1", "--clusterd", grpc_addr, "--backend", "sim",
                        "--http-addr", urls["deviced"], log=tmp_path / "deviced.log",
                    ),
                ]
                # fmt: on
                return {
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
        finally:
            for p in procs:
                await _stop(p)
