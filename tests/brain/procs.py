"""Child processes for async tests without uvloop's fork(): gRPC's fork handlers can crash a forked
child while gRPC threads run, so children are started with the stdlib (vfork + exec) from threads."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

CLI = [sys.executable, "-c", "import sys; from fmtools.cli import main; sys.exit(main())"]


async def run(argv: list[str], timeout_s: float = 60.0, env: dict | None = None, cwd: str | None = None):
    """Run ``argv`` to completion in a thread; returns (returncode, stdout, stderr) as text."""
    r = await asyncio.to_thread(
        subprocess.run, argv, capture_output=True, text=True, timeout=timeout_s, env=env, cwd=cwd
    )
    return r.returncode, r.stdout, r.stderr


class Background:
    """A long-running child whose stdout (JSON lines) goes to a file that :meth:`lines` parses."""

    def __init__(self, argv: list[str], out: Path) -> None:
        self.argv = argv
        self.out = out
        self.proc: subprocess.Popen | None = None

    def start(self) -> Background:
        with open(self.out, "w") as f:
            self.proc = subprocess.Popen(self.argv, stdout=f, stderr=subprocess.STDOUT)
        return self

    def lines(self) -> list[dict]:
        out = []
        for line in self.out.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
