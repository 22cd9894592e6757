"""The local faultmesh stack on 127.0.0.1: clusterd, then per simulated server a BMC simulator
(``faultmesh bmc-sim``), a noded polling it over IPMI, and a deviced with the ``sim`` DCMI backend.

Used by the demo (:mod:`fmtools.demo.scenario`) and by ``faultmesh up``. Every port is picked
free at start; every process logs to ``<run dir>/logs/<name>.log``; :meth:`Stack.stop` stops them by
PID. Parts that other issues add (pingmesh with the fabric simulator, FD-OL, the brain) are turned
on when the installed programs offer their flags (``--help`` is read once per program), so the
stack runs with whatever is installed.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from faultmesh.runtime import wait_for
from fmtools.demo.procs import Child, ProcessGroup, free_port, free_udp_port, python_argv

BMC_USER = "demo"
BMC_PASSWORD = "demo-bmc-password"


@dataclass
class StackConfig:
    """What to start and how often things poll.

    ``servers``: number of simulated servers (named ``server-1`` ...); ``npus``: NPUs per server
    (``npus // 8`` cards of 8); ``bmc_poll_s``: noded's BMC poll period (s, 1..600);
    ``list_watch_s``: deviced's list-watch period (s, 3..1800); ``report_interval_s``: agents'
    minimum report interval (s); ``pingmesh_interval_s``: pingmesh task_interval (s, 1..60);
    ``extra``: free-form per-program extra argv (``{"clusterd": [...], "noded": [...]}``);
    ``gpu_servers``: simulated NVIDIA GPU servers beside them (``gpu-server-1`` ..., 8 GPUs each): a
    deviced only, ``--backend sim --sim-vendor nvidia`` with the NVIDIA fault table (issue 33); its
    extra argv is ``extra["deviced-gpu"]``.
    """

    servers: int = 4
    gpu_servers: int = 0
    npus: int = 16
    bmc_poll_s: float = 2.0
    list_watch_s: int = 3
    report_interval_s: float = 1.0
    pingmesh_interval_s: int = 1
    pingmesh_period_s: float = 0.0
    report_timeout_s: float = 60.0
    log_level: str = "INFO"
    log_format: str = "text"
    extra: dict[str, list[str]] = field(default_factory=dict)


@dataclass
class Server:
    """One simulated server: its name and the addresses of its three processes."""

    name: str
    index: int
    bmc_port: int
    bmc_control: str
    noded_http: str
    deviced_http: str
    gpu: bool = False  # a simulated NVIDIA GPU server (deviced --sim-vendor nvidia)


class StackError(RuntimeError):
    """The stack could not start (a process died or never became ready); the message says which."""


class Stack:
    """The running stack. ``await start()``, then use the addresses; ``await stop()`` always.

    ``run_dir``: folder for logs (``logs/``), clusterd state (``state/``), secrets and data files.
    ``say``: callable printing one timestamped progress line.
    """

    def __init__(self, cfg: StackConfig, run_dir: Path, say=print) -> None:
        self.cfg = cfg
        self.run_dir = run_dir
        self.log_dir = run_dir / "logs"
        self.say = say
        env = _child_env()
        env["FAULTMESH_DEMO_RUN_DIR"] = str(run_dir)  # marks every process of this run (and its children)
        self.procs = ProcessGroup(self.log_dir, env=env)
        self.grpc = f"127.0.0.1:{free_port()}"
        self.http = f"127.0.0.1:{free_port()}"
        self.servers: list[Server] = []
        self.session: aiohttp.ClientSession | None = None
        self._help: dict[str, str] = {}
        self.fabric_file: Path | None = None  # set when pingmesh runs on the fabric simulator
        self.features: dict[str, bool] = {}
        self.started_at = 0.0  # wall time when every agent was connected
        self.profiling_dir = run_dir / "profiling"  # <job id>/<rank>/ record files (faultmesh.profiler)
        self.datatrace_dir = run_dir / "datatrace"  # <ns>.data-trace-<job>/profilingSwitch

    # -- helpers -------------------------------------------------------------------------------
    async def help_text(self, module: str, *sub: str) -> str:
        """``python -m module *sub --help`` output (cached); empty when the program is missing."""
        key = " ".join((module, *sub))
        if key not in self._help:
            try:
                p = await asyncio.create_subprocess_exec(
                    *python_argv(module, *sub, "--help"),
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.STDOUT,
                    env=_child_env(),
                )
                out, _ = await wait_for(p.communicate(), 60)
                self._help[key] = out.decode(errors="replace") if p.returncode == 0 else ""
            except (OSError, TimeoutError):
                self._help[key] = ""
        return self._help[key]

    async def has_flag(self, module: str, flag: str) -> bool:
        """Whether ``python -m module --help`` lists ``flag``."""
        return flag in (await self.help_text(module)).split()

    async def get_json(self, url: str, timeout_s: float = 5.0) -> Any:
        """GET ``url`` and decode JSON; raises aiohttp/asyncio errors, ``StackError`` on HTTP >= 400."""
        assert self.session is not None
        async with self.session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            if r.status >= 400:
                raise StackError(f"GET {url}: HTTP {r.status}: {(await r.text())[:200]}")
            return await r.json(content_type=None)

    async def post_json(self, url: str, body: Any, timeout_s: float = 5.0) -> Any:
        """POST JSON to ``url``; returns the decoded reply; ``StackError`` on HTTP >= 400."""
        assert self.session is not None
        async with self.session.post(url, json=body, timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            text = await r.text()
            if r.status >= 400:
                raise StackError(f"POST {url}: HTTP {r.status}: {text[:300]}")
            return json.loads(text) if text else None

    async def clusterd_json(self, path: str) -> Any:
        """GET ``http://<clusterd http><path>`` as JSON."""
        return await self.get_json(f"http://{self.http}{path}")

    async def wait_ready(self, child: Child, url: str, timeout_s: float = 60.0) -> None:
        """Wait until ``url`` answers 200 while ``child`` lives; ``StackError`` otherwise."""
        assert self.session is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not child.alive:
                raise StackError(f"{child.name} exited with {child.proc.returncode}; see {child.log_path}")
            try:
                async with self.session.get(url, timeout=aiohttp.ClientTimeout(total=2)) as r:
                    if r.status == 200:
                        return
            except (aiohttp.ClientError, TimeoutError, OSError):
                pass
            await asyncio.sleep(0.2)
        raise StackError(f"{child.name} not ready at {url} after {timeout_s:.0f} s; see {child.log_path}")

    # -- start ---------------------------------------------------------------------------------
    async def start(self) -> None:
        """Start clusterd, then every server's bmc-sim, noded and deviced; wait until clusterd sees
        both agents of every server. Raises :class:`StackError`."""
        self.session = aiohttp.ClientSession()
        (self.run_dir / "state").mkdir(parents=True, exist_ok=True)
        secret = self.run_dir / "bmc-password"
        secret.write_text(BMC_PASSWORD + "\n")
        secret.chmod(0o600)
        cfg = self.cfg
        await self.probe_features()
        self.say(
            "installed parts: core (clusterd, noded, deviced, bmc-sim), "
            + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in self.features.items())
        )
        cd_extra: list[str] = []
        noded_extra: list[str] = []
        if self.features["pingmesh"]:
            cd_extra, noded_extra = self.pingmesh_setup()
        if self.features["brain"]:
            # training containers mount <dir>/<ns>.data-trace-<job>/profilingSwitch (brain writes it)
            cd_extra += [
                "--data-trace-dir",
                str(self.datatrace_dir),
                "--report-timeout-s",
                f"{cfg.report_timeout_s:g}",
            ]
        if self.features["slownode"]:
            noded_extra += ["--profiling-dir", str(self.profiling_dir)]

        cd_args = [
            "--grpc-addr",
            self.grpc,
            "--http-addr",
            self.http,
            "--state-dir",
            str(self.run_dir / "state"),
            "--log-level",
            cfg.log_level,
            "--log-format",
            cfg.log_format,
            *cd_extra,
            *cfg.extra.get("clusterd", []),
        ]
        cd = await self.procs.start("clusterd", python_argv("clusterd", *cd_args))
        await self.wait_ready(cd, f"http://{self.http}/readyz")
        self.say(f"clusterd ready: gRPC {self.grpc}, HTTP http://{self.http} (pid {cd.pid})")

        names = [f"server-{i}" for i in range(1, cfg.servers + 1)]
        names += [f"gpu-server-{i}" for i in range(1, cfg.gpu_servers + 1)]
        for i, name in enumerate(names, 1):
            self.servers.append(
                Server(
                    name=name,
                    index=i,
                    bmc_port=free_udp_port(),
                    bmc_control=f"127.0.0.1:{free_port()}",
                    noded_http=f"127.0.0.1:{free_port()}",
                    deviced_http=f"127.0.0.1:{free_port()}",
                    gpu=name.startswith("gpu-"),
                )
            )
        # bmc simulators first (noded polls them), all at once
        sims = []
        for s in [s for s in self.servers if not s.gpu]:  # a GPU server runs deviced only
            argv = python_argv(
                "faultmesh",
                "bmc-sim",
                "--port",
                str(s.bmc_port),
                "--control-port",
                s.bmc_control.rsplit(":", 1)[1],
                "--user",
                BMC_USER,
                "--password-file",
                str(secret),
            )
            sims.append((await self.procs.start(f"bmc-sim-{s.index}", argv), s))
        await asyncio.gather(*(self.wait_ready(c, f"http://{s.bmc_control}/state") for c, s in sims))
        self.say(f"{len(sims)} BMC simulators ready (IPMI lanplus on 127.0.0.1 UDP)")

        agents = []
        for s in self.servers:
            noded = python_argv(
                "noded",
                "--node-name",
                s.name,
                "--clusterd",
                self.grpc,
                "--bmc-host",
                "127.0.0.1",
                "--bmc-port",
                str(s.bmc_port),
                "--bmc-user",
                BMC_USER,
                "--bmc-password-file",
                str(secret),
                "--poll-interval",
                f"{cfg.bmc_poll_s:g}",
                "--min-report-interval",
                f"{cfg.report_interval_s:g}",
                "--http-addr",
                s.noded_http,
                "--log-level",
                cfg.log_level,
                "--log-format",
                cfg.log_format,
                *[a.replace("{node}", s.name) for a in noded_extra],
                *cfg.extra.get("noded", []),
            )
            if not s.gpu:  # a GPU server runs deviced only (no BMC, not in the NPU pingmesh fabric)
                agents.append(
                    (await self.procs.start(f"noded-{s.index}", noded), f"http://{s.noded_http}/healthz")
                )
            deviced = python_argv(
                "deviced",
                "--node-name",
                s.name,
                "--clusterd",
                self.grpc,
                "--backend",
                "sim",
                *(["--sim-vendor", "nvidia"] if s.gpu else []),
                "--sim-cards",
                str(1 if s.gpu else max(1, cfg.npus // 8)),
                "--sim-devices-per-card",
                str(8 if s.gpu else min(8, cfg.npus)),
                "--list-watch-period",
                str(cfg.list_watch_s),
                "--http-addr",
                s.deviced_http,
                "--log-level",
                cfg.log_level,
                "--log-format",
                cfg.log_format,
                *cfg.extra.get("deviced-gpu" if s.gpu else "deviced", []),
            )
            agents.append(
                (await self.procs.start(f"deviced-{s.index}", deviced), f"http://{s.deviced_http}/healthz")
            )
        await asyncio.gather(*(self.wait_ready(c, url, 90) for c, url in agents))
        await self.wait_agents()
        self.started_at = time.time()
        gpus = (
            f", {cfg.gpu_servers} GPU servers (deviced, 8 simulated NVIDIA GPUs each)"
            if cfg.gpu_servers
            else ""
        )
        self.say(
            f"{cfg.servers} servers up: noded + deviced each, {cfg.npus} simulated NPUs per server{gpus}, "
            "all connected to clusterd"
        )

    async def probe_features(self) -> None:
        """Which optional parts the installed programs offer (read from their ``--help``)."""
        cd, nd = await asyncio.gather(self.help_text("clusterd"), self.help_text("noded"))
        cdf, ndf = set(cd.split()), set(nd.split())
        self.features = {
            "pingmesh": "--slownet-topology" in cdf and "--pingmesh-fabric" in ndf,
            "brain": "--data-trace-dir" in cdf,
            "slownode": "--slownode-watch-dir" in cdf and "--profiling-dir" in ndf,
        }

    def pingmesh_setup(self) -> tuple[list[str], list[str]]:
        """Write the super-pod fabric file (servers x NPUs, one super pod), its topology and the
        pingmesh-config; return (clusterd flags, noded flags with ``{node}`` placeholders)."""
        from fmtools.sims import fabric

        cfg = self.cfg
        self.fabric_file = self.run_dir / "fabric.json"
        names = [f"server-{i}" for i in range(1, cfg.servers + 1)]
        spec = {"super_pod_id": "0", "nodes": names, "npus_per_node": cfg.npus, "seed": 7, "faults": []}
        fabric.write_fabric_file(self.fabric_file, spec)
        topo = self.run_dir / "super-pod-0.json"
        topo.write_text(json.dumps(fabric.Fabric.from_file(self.fabric_file).sp.to_json_obj(), indent=1))
        pm_cfg = self.run_dir / "pingmesh-config.json"
        act = json.dumps({"activate": "on", "task_interval": cfg.pingmesh_interval_s})
        pm_cfg.write_text(json.dumps({"global": act}) + "\n")
        cd = ["--slownet-topology", str(topo), "--slownet-config", str(pm_cfg)]
        nd = [
            "--pingmesh-backend",
            "sim",
            "--pingmesh-fabric",
            str(self.fabric_file),
            "--pingmesh-dir",
            str(self.run_dir / "pingmesh" / "{node}"),
        ]
        if cfg.pingmesh_period_s > 0:
            cd += ["--slownet-period-s", f"{cfg.pingmesh_period_s:g}"]
            nd += ["--pingmesh-collect-interval-s", f"{cfg.pingmesh_period_s:g}"]
        return cd, nd

    def pingmesh_period(self) -> float:
        """The pingmesh collection / slow-network detection period (s)."""
        return self.cfg.pingmesh_period_s or 10.0 * self.cfg.pingmesh_interval_s

    async def wait_agents(self, timeout_s: float = 60.0) -> None:
        """Wait until clusterd's ``/v1/nodes`` shows noded and deviced connected for every server."""
        want = {s.name: {"deviced"} if s.gpu else {"noded", "deviced"} for s in self.servers}
        deadline = time.monotonic() + timeout_s
        seen: dict[str, list[str]] = {}
        while time.monotonic() < deadline:
            try:
                nodes = await self.clusterd_json("/v1/nodes")
                seen = {n["name"]: n.get("agents", []) for n in nodes}
                if all(agents <= set(seen.get(n, [])) for n, agents in want.items()):
                    return
            except (aiohttp.ClientError, TimeoutError, OSError, StackError):
                pass
            for c in self.procs.dead():
                raise StackError(f"{c.name} exited with {c.proc.returncode}; see {c.log_path}")
            await asyncio.sleep(0.3)
        raise StackError(f"agents not all connected after {timeout_s:.0f} s: clusterd sees {seen}")

    def server(self, index: int) -> Server:
        """Server ``index`` (1-based)."""
        return self.servers[index - 1]

    async def stop(self) -> None:
        """Stop every process by PID (agents first, clusterd last) and close the HTTP session."""
        await self.procs.stop_all()
        if self.session is not None:
            await self.session.close()
            self.session = None


def _child_env() -> dict[str, str]:
    import os

    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env["OMP_NUM_THREADS"] = env.get("OMP_NUM_THREADS", "1")
    return env
