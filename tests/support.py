"""Test support shared by every test folder (importable as ``support``: tests/ is on pythonpath)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# ../shared next to the checkout; FAULTMESH_SHARED points elsewhere (a git worktree whose parent has none).
SHARED = Path(os.environ.get("FAULTMESH_SHARED") or ROOT.parent / "shared")
FAULT_TABLES = SHARED / "data" / "fault-tables"


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout_s: float = 20.0, proc=None) -> None:
    """Poll ``url`` until it answers 200 (raises ``TimeoutError``). With ``proc`` (the
    ``subprocess.Popen`` that serves it) the wait ends as soon as that process has exited:
    ``ChildProcessError`` naming its exit code."""
    import time
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if proc is not None and proc.poll() is not None:
            raise ChildProcessError(
                f"{url}: its process exited with code {proc.returncode} before it answered"
            )
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} did not answer within {timeout_s}s")
        time.sleep(0.1)


class DaemonProcess:
    """A daemon as a real subprocess: ``cmd`` (argv), its HTTP endpoint ``http`` (host:port), stdout
    and stderr appended to ``log_path`` by every start, ``env`` added to ours. Stopped by its PID
    (:func:`stop_proc`: SIGTERM, SIGKILL after 15 s)."""

    def __init__(self, cmd: list[str], http: str, log_path: Path, env: dict[str, str] | None = None) -> None:
        self.cmd = cmd
        self.http = http
        self.log_path = log_path
        self.env = env
        self.proc = None
        self._log = None

    def _spawn(self) -> int:
        """Start ``cmd``; returns the log's size before this run (where its lines begin)."""
        import subprocess

        self._close_log()
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed by stop() or the next start
        begin = self._log.tell()
        env = {**os.environ, **self.env} if self.env else None
        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env)
        return begin

    PORT_TRIES = 3

    def _start_ready(self, path: str, movable: list[str]) -> None:
        """Start and wait until ``path`` answers 200. When the daemon exits with "address already in
        use" (a free port taken by a test beside this one before the daemon bound it), the addresses
        named in ``movable`` (attributes, host:port, also in ``cmd``) move to free ports and it starts
        again, ``PORT_TRIES`` times in all; ``movable`` empty: no move (a restart keeps its ports)."""
        for _ in range(self.PORT_TRIES):
            begin = self._spawn()
            try:
                self._ready(path)
                return
            except ChildProcessError:
                with open(self.log_path, "rb") as f:
                    f.seek(begin)
                    if not movable or b"already in use" not in f.read().lower():
                        raise
            for attr in movable:
                new = f"127.0.0.1:{free_port()}"
                self.cmd[self.cmd.index(getattr(self, attr))] = new
                setattr(self, attr, new)
        raise TimeoutError(f"{self.cmd[2]} found no free port in {self.PORT_TRIES} tries: {self.log_path}")

    def _ready(self, path: str) -> None:
        """Wait until ``path`` answers 200: ``TimeoutError`` after 20 s, ``ChildProcessError`` (with
        the log's last lines) as soon as the process has exited."""
        try:
            wait_http(self.url(path), proc=self.proc)
        except ChildProcessError as e:
            raise ChildProcessError(f"{e}; {self.log_path}:\n{self.log_text()[-3000:]}") from None

    def url(self, path: str) -> str:
        return f"http://{self.http}{path}"

    def get_json(self, path: str):
        import json
        import urllib.request

        with urllib.request.urlopen(self.url(path), timeout=5) as r:
            return json.loads(r.read())

    def kill9(self) -> None:
        import signal

        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> int | None:
        """Stop it by its PID (SIGTERM, SIGKILL after 15 s); returns its exit code (None: never started)."""
        if self.proc:
            stop_proc(self.proc, 15.0)
        self._close_log()
        return self.proc.returncode if self.proc else None

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


class ClusterdProcess(DaemonProcess):
    """A real ``clusterd`` subprocess on free loopback ports (``grpc``, ``http`` = host:port)."""

    def __init__(self, state_dir: Path, extra: list[str] | None = None, log_path: Path | None = None) -> None:
        import sys

        self.state_dir = state_dir
        self.grpc = f"127.0.0.1:{free_port()}"
        http = f"127.0.0.1:{free_port()}"
        self.extra = list(extra or [])
        cmd = [
            sys.executable, "-m", "clusterd", "--grpc-addr", self.grpc, "--http-addr", http,
            "--state-dir", str(state_dir), *self.extra,
        ]  # fmt: skip
        super().__init__(
            cmd, http, log_path or state_dir.parent / f"clusterd-{self.grpc.rsplit(':', 1)[1]}.log"
        )

    def start(self, ready_path: str = "/readyz") -> ClusterdProcess:
        """Start and wait until ``ready_path`` answers 200 (``/healthz`` for a follower replica); a
        first start whose port was taken meanwhile moves to free ones (:meth:`_start_ready`), a
        restart keeps them (agents and tests hold the addresses)."""
        self._start_ready(ready_path, ["grpc", "http"] if self.proc is None else [])
        return self


class NodedProcess(DaemonProcess):
    """``python -m noded`` for node ``node`` reporting to clusterd at ``clusterd`` (host:port), with
    ``extra`` flags; its HTTP endpoint (``/healthz``, ``/metrics``, ``/v1/state``) on a free loopback
    port, moved to another when that one is taken before noded binds it (tests run side by side).
    Log: ``tmp/noded-<node>.log``, appended to by every start."""

    def __init__(self, tmp: Path, node: str, clusterd: str, *extra: str) -> None:
        import sys

        self.node = node
        http = f"127.0.0.1:{free_port()}"
        cmd = [
            sys.executable, "-m", "noded", "--node-name", node, "--clusterd", clusterd, "--http-addr", http,
            *extra,
        ]  # fmt: skip
        super().__init__(cmd, http, tmp / f"noded-{node}.log", env={"PYTHONUNBUFFERED": "1"})

    def start(self) -> NodedProcess:
        """Start and wait until ``/healthz`` answers (``ChildProcessError`` when noded exits,
        ``TimeoutError`` after 20 s), moving to another HTTP port when its own was taken."""
        self._start_ready("/healthz", ["http"])
        return self

    def metrics(self) -> str:
        """The Prometheus text of ``/metrics``."""
        import urllib.request

        with urllib.request.urlopen(self.url("/metrics"), timeout=5) as r:
            return r.read().decode()


def slownode_noded(tmp: Path, node: str, clusterd: str, profiling_dir: Path, *extra: str) -> NodedProcess:
    """A :class:`NodedProcess` with the slow-node component's flags: it reads the jobs' records under
    ``profiling_dir`` and reports at most every 0.1 s."""
    return NodedProcess(
        tmp, node, clusterd, "--profiling-dir", str(profiling_dir), "--min-report-interval", "0.1", *extra
    )


async def make_clusterd(tmp_path: Path, *extra: str):
    """Start an in-process ClusterD with every registered component on free ports; the caller stops it."""
    from clusterd.app import ClusterD, _load_component_classes, build_parser

    classes = _load_component_classes()
    args = build_parser(classes).parse_args(
        [
            # port 0: the OS picks free ports at bind time (no race with other sockets); tests read
            # them back from cd.grpc_port and cd.http.port
            "--grpc-addr",
            "127.0.0.1:0",
            "--http-addr",
            "127.0.0.1:0",
            "--state-dir",
            str(tmp_path / "state"),
            *extra,
        ]
    )
    cd = ClusterD(args, classes)
    await cd.start()
    return cd


def public_request(fault_id: str, node: str = "node-1", code: str = "010001001"):
    """A valid one-fault PubFault request (resource CCAE, NPU device 0 of ``node``)."""
    import time

    from faultmesh._pb import pubfault_pb2

    now = int(time.time() * 1000)
    return pubfault_pb2.PublicFaultRequest(
        id=f"req-{fault_id}",
        timestamp=now,
        version="1.0",
        resource="CCAE",
        faults=[
            pubfault_pb2.Fault(
                faultId=fault_id,
                faultType="NPU",
                faultCode=code,
                faultTime=now,
                assertion="occur",
                influence=[pubfault_pb2.PubFaultInfo(nodeName=node, deviceIds=[0])],
            )
        ],
    )


async def until(pred, timeout_s: float = 8.0) -> bool:
    """Await until ``pred()`` is true, polling every 50 ms (raises ``AssertionError`` on timeout)."""
    await eventually(pred, timeout_s)
    return True


def http_call(method: str, url: str, body=None) -> tuple[int, object]:
    """One JSON HTTP call: (status, decoded body); (0, None) when nothing answers."""
    import json
    import urllib.error
    import urllib.request

    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")
    except (urllib.error.URLError, ConnectionError):
        return 0, None


def start_logged(args: list[str], log: Path, env: dict[str, str] | None = None):
    """Start a daemon process with stdout+stderr into ``log`` (unbuffered; ``env`` added to ours)."""
    import subprocess

    f = open(log, "wb")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(
        args, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    )


def stop_proc(p, timeout_s: float = 10.0) -> None:
    """Stop the ``subprocess.Popen`` ``p`` (e.g. from :func:`start_logged`) by its PID: SIGTERM,
    SIGKILL after ``timeout_s``."""
    import signal
    import subprocess

    if p.poll() is None:
        os.kill(p.pid, signal.SIGTERM)
        try:
            p.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.kill(p.pid, signal.SIGKILL)
            p.wait(5)


def wait_for(pred, what: str = "condition", timeout_s: float = 20.0, every_s: float = 0.1):
    """Poll ``pred()`` every ``every_s`` seconds until it returns something truthy, and return that.
    An ``OSError`` from ``pred`` (a server restarting, a connection refused) counts as not yet.
    Raises ``AssertionError`` naming ``what`` and the last value or error after ``timeout_s``."""
    import time

    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        try:
            if got := pred():
                return got
            last = got
        except OSError as e:
            last = e
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}; last={last!r}")


class ChangeWatch:
    """Records every change the in-process ClusterD ``cd`` commits and samples its faults every
    ``every_s`` (50 ms) while running: ``recovers`` (changes of kind recover), ``gaps`` (samples in
    which one of ``keys()`` was missing). Use as ``async with ChangeWatch(cd, keys) as w: ...``."""

    def __init__(self, cd, keys, every_s: float = 0.05) -> None:
        self.cd = cd
        self.keys = keys
        self.every_s = every_s
        self.changes: list = []
        self.gaps: list = []
        self.samples = 0
        self._task = None

    @property
    def recovers(self) -> list:
        return [c for c in self.changes if c.kind == "recover"]

    async def __aenter__(self) -> ChangeWatch:
        import asyncio

        self.cd.center.subscribe(f"change-watch-{id(self)}", self.changes.extend)
        self._task = asyncio.create_task(self._sample())
        return self

    async def _sample(self) -> None:
        import asyncio

        while True:
            have = {f.key for f in self.cd.center.faults()}
            missing = [k for k in self.keys() if k not in have]
            if missing:
                self.gaps.append(missing)
            self.samples += 1
            await asyncio.sleep(self.every_s)

    async def __aexit__(self, *exc) -> None:
        import asyncio
        import contextlib

        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


async def eventually(pred, timeout_s: float = 15.0, what: str = "condition", every_s: float = 0.05):
    """Await until ``pred()`` (sync, or returning an awaitable) is truthy, checked every ``every_s``;
    returns its value. Raises ``AssertionError`` naming ``what`` after ``timeout_s``."""
    import asyncio
    import inspect

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        got = pred()
        if inspect.isawaitable(got):
            got = await got
        if got:
            return got
        await asyncio.sleep(every_s)
    raise AssertionError(f"timed out waiting for {what}")


# -- `faultmesh up` (tests/demo) ---------------------------------------------------------------------
def start_up(run_dir: Path, *args: str):
    """``python -m faultmesh up --run-dir RUN_DIR ARGS...`` in its own session, stdout and stderr
    merged into ``proc.stdout`` (text). Stop it with :func:`up_stopped`."""
    import subprocess
    import sys

    return subprocess.Popen(
        [sys.executable, "-m", "faultmesh", "up", "--run-dir", str(run_dir), *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip


def up_pids(run_dir: Path, module: str | None = None) -> list[int]:
    """The processes ``faultmesh up`` started for ``run_dir`` (they carry
    ``FAULTMESH_DEMO_RUN_DIR=<run_dir>`` in their environment); with ``module`` only those that have
    it as one argument of their command line (``noded``, ...)."""
    mark = f"FAULTMESH_DEMO_RUN_DIR={run_dir}".encode()
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if mark in (d / "environ").read_bytes().split(b"\0") and (
                    module is None or module.encode() in (d / "cmdline").read_bytes().split(b"\0")
                ):
                    out.append(int(d.name))
            except OSError:
                continue
    return out


def read_until(proc, lines: list[str], text: str, timeout_s: float) -> str:
    """Read ``proc.stdout`` into ``lines`` until a line holds ``text`` (or ``timeout_s`` passed at a
    line); returns all read so far. Raises ``AssertionError`` (with the output) when ``text`` never came."""
    import time

    deadline = time.monotonic() + timeout_s
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if text in line or time.monotonic() > deadline:
            break
    out = "".join(lines)
    assert text in out, out
    return out


def up_stopped(proc) -> None:
    """Kill ``proc``'s whole session if it still runs (a test's ``finally``: nothing outlives it)."""
    import signal

    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


# -- the agent stream, raw (tests/clusterd) -----------------------------------------------------------
async def agent_stream(
    port: int, messages, quiet_s: float = 1.0, ack_wait_s: float = 15.0
) -> tuple[list, bool]:
    """Send ``messages`` (``AgentMessage``) on one ``AgentStream/Connect`` to clusterd's gRPC port;
    returns (the ``ControlMessage`` replies, whether the server ended the stream). Replies are read
    until the server ends the stream, or is quiet for ``quiet_s`` seconds once an ack came for every
    Snapshot and Delta sent (``ack_wait_s`` while one is still owed: a loaded box may take over a
    second between two acks)."""
    import asyncio

    import grpc

    from faultmesh._pb import agent_pb2_grpc

    out = []
    ended = False
    owed = sum(m.WhichOneof("body") in ("snapshot", "delta") for m in messages)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        call = agent_pb2_grpc.AgentStreamStub(ch).Connect()
        for m in messages:
            await call.write(m)
        while True:
            acked = sum(r.WhichOneof("body") == "ack" for r in out)
            try:
                msg = await asyncio.wait_for(call.read(), quiet_s if acked >= owed else ack_wait_s)
            except TimeoutError:
                break
            if msg is grpc.aio.EOF:
                ended = True
                break
            out.append(msg)
        call.cancel()
    return out, ended


def cli_inproc(capsys, *args: str):
    """``faultmesh ARGS`` run in-process (argparse's exits caught) -> ``subprocess.CompletedProcess``
    with the exit code and what ``capsys`` captured, as a run of the command would report it."""
    import subprocess

    from fmtools.cli import main

    try:
        rc = main(list(args))
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(list(args), rc, out, err)
