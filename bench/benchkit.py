"""What the benches share: a free loopback port, a real clusterd process and the delta rate while
clusterd is scraped (issue 18)."""

from __future__ import annotations

import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable


def median_ms(fn: Callable[[], object], rounds: int) -> float:
    """The median wall time of ``rounds`` calls of ``fn()``, in ms (the encode/decode benches)."""
    out = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1000)
    return statistics.median(out)


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (bound and released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Clusterd:
    """A clusterd process on free loopback ports with its own state dir: ``with Clusterd(*flags) as c:``
    gives ``c.grpc`` / ``c.http`` (host:port) once ``/readyz`` answers (up to ``ready_s`` s; raises
    ``TimeoutError``); on exit it is terminated (SIGTERM, 20 s) and the state dir removed. With
    ``state_dir`` it uses (and keeps) that folder: a restart on the same state. With ``profile`` (a
    path) it runs under cProfile, which writes that file when clusterd stops."""

    def __init__(
        self,
        *flags: str,
        log_level: str = "WARNING",
        ready_s: float = 20.0,
        state_dir: str | None = None,
        profile: str | None = None,
    ) -> None:
        self.flags = flags
        self.log_level = log_level
        self.ready_s = ready_s
        self.grpc = f"127.0.0.1:{free_port()}"
        self.http = f"127.0.0.1:{free_port()}"
        self.state = state_dir or ""
        self._keep = state_dir is not None
        self.profile = profile
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> Clusterd:
        if not self._keep:
            self.state = tempfile.mkdtemp(prefix="fm-bench-")
        prof = ["-m", "cProfile", "-o", self.profile] if self.profile else []
        self.proc = subprocess.Popen(
            [sys.executable, *prof, "-m", "clusterd", "--grpc-addr", self.grpc, "--http-addr", self.http,
             "--state-dir", self.state, "--log-level", self.log_level, *self.flags],
        )  # fmt: skip
        deadline = time.monotonic() + self.ready_s
        while True:
            try:
                urllib.request.urlopen(f"http://{self.http}/readyz", timeout=1)
                return self
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.__exit__()
                    raise TimeoutError(f"clusterd not ready on {self.http}") from None
                time.sleep(0.1)

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if not self._keep:
            shutil.rmtree(self.state, ignore_errors=True)

    @property
    def pid(self) -> int:
        """The clusterd process id (for /proc figures)."""
        assert self.proc is not None
        return self.proc.pid


def get_s(url: str) -> tuple[float, bytes]:
    """``GET url``: (seconds until the whole body was read, the body)."""
    t = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as r:
        body = r.read()
    return time.perf_counter() - t, body


def scrape_while_ingest(
    fleet, cd: Clusterd, paths: tuple[str, ...], seconds: float, agents: int = 200
) -> dict:
    """The delta rate of ``agents`` load agents (``fleet``: a :class:`loadgen.Fleet`, window 4) into
    ``cd`` for ``seconds`` quiet, then for ``seconds`` with every path of ``paths`` fetched once
    per second by a thread of this process. Returns ``{"quiet", "scraped"}`` (deltas/s),
    ``"scrapes"`` (how many rounds ran) and ``"scrape_s"``: path -> median seconds of its GET while
    ingesting (NaN when none ran). The streams are closed on return."""
    import statistics
    import threading

    ids = list(range(agents))
    quiet = fleet.run("deltas", ids, addr=cd.grpc, seconds=seconds, window=4)
    stop = threading.Event()
    rounds: dict[str, list[float]] = {p: [] for p in paths}

    def scraper() -> None:
        while not stop.wait(1.0):
            for p in paths:
                rounds[p].append(get_s(f"http://{cd.http}{p}")[0])

    th = threading.Thread(target=scraper, daemon=True)
    th.start()
    try:
        busy = fleet.run("deltas", ids, addr=cd.grpc, seconds=seconds, window=4)
    finally:
        stop.set()
        th.join(60)
        fleet.close_streams()
    return {
        "quiet": quiet["n"] / quiet["wall_s"],
        "scraped": busy["n"] / busy["wall_s"],
        "scrapes": min(len(v) for v in rounds.values()),
        "scrape_s": {p: statistics.median(v) if v else float("nan") for p, v in rounds.items()},
    }
