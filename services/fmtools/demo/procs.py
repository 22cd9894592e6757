"""Child processes of the demo and of ``faultmesh up``: started with their output in one log folder,
stopped by PID (SIGTERM, then SIGKILL after a grace period), in reverse start order.

Every child runs in its own session (``start_new_session``), so a Ctrl-C in the terminal reaches
only the orchestrator, which then stops each child itself: nothing is left behind and shutdown
happens in a known order (agents before clusterd). On Linux every child also gets SIGTERM when the
orchestrator dies without stopping it (``kill -9``, an OOM kill: ``PR_SET_PDEATHSIG``), so no
clusterd, agent or training job outlives it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from faultmesh.runtime import wait_for

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _parent_death_signal():
    """A ``preexec_fn`` that has the child get SIGTERM when this process dies (Linux; None
    elsewhere or without libc). libc is resolved here, before the fork, so the child only calls it;
    a child whose parent died before the call exits at once."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the parent died between the fork and the prctl
            os._exit(1)

    return preexec


_GIVEN: set[tuple[int, int]] = set()  # (socket type, port) handed out by this process


def _free(kind: int) -> int:
    """A port of socket type ``kind`` on 127.0.0.1 that was free a moment ago and that this process
    has not handed out before: the OS may give the same port to two bind-to-0 calls in a row once
    the first socket is closed (the demo once gave a BMC simulator's control port to a noded)."""
    while True:
        with socket.socket(socket.AF_INET, kind) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if (kind, port) not in _GIVEN:
            _GIVEN.add((kind, port))
            return port


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago and is not one handed out already."""
    return _free(socket.SOCK_STREAM)


def free_udp_port() -> int:
    """A UDP port on 127.0.0.1 that was free a moment ago (for the IPMI simulator), not handed out already."""
    return _free(socket.SOCK_DGRAM)


@dataclass
class Child:
    """One started process: ``name`` (also its log file ``<log_dir>/<name>.log``), argv, Popen-like proc."""

    name: str
    argv: list[str]
    proc: asyncio.subprocess.Process
    log_path: Path
    started_s: float = field(default_factory=time.monotonic)
    stopping: bool = False  # set when the orchestrator ends it (an exit then is expected)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None


class ProcessGroup:
    """The processes one orchestrator started. ``await start(...)``; ``await stop_all()`` at the end.

    ``log_dir``: every child's stdout and stderr go to ``<log_dir>/<name>.log``.
    """

    def __init__(self, log_dir: Path, env: dict[str, str] | None = None) -> None:
        self.log_dir = log_dir
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.env = dict(os.environ if env is None else env)
        self.children: list[Child] = []

    async def start(
        self, name: str, argv: list[str], env: dict[str, str] | None = None, cwd: str | None = None
    ) -> Child:
        """Start ``argv`` as child ``name``; returns at once (readiness is the caller's check).

        Raises ``OSError`` when the program cannot be started.
        """
        log_path = self.log_dir / f"{name}.log"
        full_env = dict(self.env)
        if env:
            full_env.update(env)
        with _open_log(log_path, argv) as out:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
                env=full_env,
                cwd=cwd,
                start_new_session=True,
                preexec_fn=_parent_death_signal(),
            )
        child = Child(name, argv, proc, log_path)
        self.children.append(child)
        return child

    def get(self, name: str) -> Child | None:
        """The child called ``name`` (the latest one), or None."""
        for c in reversed(self.children):
            if c.name == name:
                return c
        return None

    def dead(self) -> list[Child]:
        """Children that exited although nobody asked them to (``stopping`` unset)."""
        return [c for c in self.children if not c.alive and not c.stopping]

    async def stop(self, child: Child, grace_s: float = 5.0) -> int | None:
        """SIGTERM ``child`` by PID; SIGKILL after ``grace_s``. Returns its exit status.

        The signal goes to the child's process group, whose id is the child's PID (each child is a
        session leader), so processes it spawned itself (the PyTorch ranks) stop with it.
        """
        child.stopping = True
        if child.alive:
            _signal_tree(child.pid, signal.SIGTERM)
            try:
                await wait_for(child.proc.wait(), grace_s)
            except TimeoutError:
                _signal_tree(child.pid, signal.SIGKILL)
                with contextlib.suppress(TimeoutError):
                    await wait_for(child.proc.wait(), 5.0)
        # the child is gone; anything left in its group (a rank whose parent died) gets SIGKILL
        _signal_tree(child.pid, signal.SIGKILL, group_only=True)
        return child.proc.returncode

    async def stop_all(self, grace_s: float = 5.0) -> None:
        """Stop every child, newest first (agents and jobs before clusterd), each by its PID.

        Children started in the same layer are stopped together to keep shutdown short.
        """
        pending = [c for c in reversed(self.children) if c.alive]
        # everything except clusterd first (concurrently), then clusterd
        first = [c for c in pending if not c.name.startswith("clusterd")]
        last = [c for c in pending if c.name.startswith("clusterd")]
        for batch in (first, last):
            if batch:
                await asyncio.gather(*(self.stop(c, grace_s) for c in batch))

    def stop_all_now(self) -> None:
        """Synchronous last resort (atexit / a second Ctrl-C): SIGKILL every live child by PID."""
        for c in self.children:
            _signal_tree(c.pid, signal.SIGKILL, group_only=c.proc.returncode is not None)


def _signal_tree(pid: int, sig: int, group_only: bool = False) -> None:
    """Send ``sig`` to the process group ``pid`` (a child we started as session leader), and to the
    process itself unless ``group_only``. Missing processes are ignored."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
    if not group_only:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _open_log(path: Path, argv: list[str]):
    """The child's log file, opened for appending, with a first line naming the command."""
    out = open(path, "ab")  # noqa: SIM115 - closed by the caller's with-block
    out.write(f"# {time.strftime('%H:%M:%S')} started: {' '.join(argv)}\n".encode())
    out.flush()
    return out


def python_argv(module: str, *args: str) -> list[str]:
    """``[sys.executable, -m, module, *args]``: children run from the same interpreter/venv."""
    return [sys.executable, "-m", module, *args]
