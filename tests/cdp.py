"""A small Chrome DevTools Protocol client over aiohttp's websocket, for the web-view tests.

``async with Browser.launch(tmp) as b: page = await b.page(); await page.goto(url)`` starts Debian's
``chromium`` headless on a free debugging port; the page collects console errors, uncaught
exceptions and failed loads (``page.errors``), evaluates expressions and captures screenshots.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import re
import shutil
from pathlib import Path
from typing import Any

import aiohttp


def chromium() -> str | None:
    """Path of a Chromium binary, or None."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Page:
    """One tab, attached over its own websocket."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future] = {}
        self._events: asyncio.Queue = asyncio.Queue()
        self.errors: list[str] = []
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for msg in self.ws:
            data = msg.json()
            if "id" in data:
                fut = self._waiting.pop(data["id"], None)
                if fut is not None and not fut.done():
                    fut.set_result(data)
                continue
            method, p = data.get("method"), data.get("params", {})
            if method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                self.errors.append(
                    "console: " + " ".join(str(a.get("value", a.get("description"))) for a in p["args"])
                )
            elif method == "Runtime.exceptionThrown":
                d = p["exceptionDetails"]
                self.errors.append(
                    "exception: " + (d.get("exception", {}).get("description") or d.get("text", ""))
                )
            elif method == "Log.entryAdded" and p["entry"]["level"] == "error":
                self.errors.append(f"log: {p['entry'].get('text')} {p['entry'].get('url', '')}")
            await self._events.put((method, p))

    async def send(self, method: str, timeout_s: float = 20.0, **params: Any) -> dict:
        """Call one CDP method; returns its ``result``. Raises ``RuntimeError`` on a protocol error."""
        i = next(self._ids)
        fut = asyncio.get_running_loop().create_future()
        self._waiting[i] = fut
        await self.ws.send_json({"id": i, "method": method, "params": params})
        data = await asyncio.wait_for(fut, timeout_s)
        if "error" in data:
            raise RuntimeError(f"{method}: {data['error']}")
        return data.get("result", {})

    async def goto(self, url: str, timeout_s: float = 20.0) -> None:
        """Navigate and wait until the page script set ``body[data-ready]``."""
        await self.send("Page.navigate", url=url)
        await self.wait_for("document.body && document.body.dataset.ready === '1'", timeout_s)

    async def evaluate(self, expr: str) -> Any:
        """The JSON value of ``expr`` in the page."""
        r = await self.send("Runtime.evaluate", expression=expr, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expr}: {r['exceptionDetails'].get('text')}")
        return r["result"].get("value")

    async def wait_for(self, expr: str, timeout_s: float = 10.0) -> None:
        """Poll ``expr`` until truthy. Raises ``TimeoutError`` with the expression."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            with contextlib.suppress(RuntimeError):
                if await self.evaluate(expr):
                    return
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"page never satisfied: {expr}")
            await asyncio.sleep(0.05)

    async def screenshot(self, path: Path) -> Path:
        """Write a full-page PNG to ``path``."""
        r = await self.send("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        await asyncio.to_thread(path.write_bytes, base64.b64decode(r["data"]))
        return path

    async def close(self) -> None:
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._reader
        await self.ws.close()


class Browser:
    """A headless Chromium process with its DevTools port."""

    def __init__(self, proc: asyncio.subprocess.Process, port: int, session: aiohttp.ClientSession) -> None:
        self.proc, self.port, self.session = proc, port, session
        self._pages: list[Page] = []

    @classmethod
    @contextlib.asynccontextmanager
    async def launch(cls, profile: Path, width: int = 1280, height: int = 900):
        exe = chromium()
        assert exe is not None
        proc = await asyncio.create_subprocess_exec(
            exe, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--no-first-run", "--no-default-browser-check", "--remote-debugging-port=0",
            f"--user-data-dir={profile}", f"--window-size={width},{height}", "about:blank",
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        session = aiohttp.ClientSession()
        b = None
        try:
            port = None
            async with asyncio.timeout(30):
                assert proc.stderr is not None
                while port is None:
                    line = (await proc.stderr.readline()).decode(errors="replace")
                    if not line:
                        raise RuntimeError("chromium exited before its DevTools port was known")
                    m = re.search(r"DevTools listening on ws://[^:]+:(\d+)/", line)
                    port = int(m.group(1)) if m else None
            drain = asyncio.create_task(proc.stderr.read())  # keep the pipe from filling
            b = cls(proc, port, session)
            yield b
        finally:
            if b is not None:
                for p in b._pages:
                    await p.close()
            await session.close()
            if proc.returncode is None:
                proc.terminate()
                try:
                    await asyncio.wait_for(proc.wait(), 10)
                except TimeoutError:
                    proc.kill()
                    await proc.wait()
            with contextlib.suppress(NameError):
                drain.cancel()

    async def page(self) -> Page:
        """A new tab with Page, Runtime and Log enabled."""
        async with self.session.put(f"http://127.0.0.1:{self.port}/json/new?about:blank") as r:
            target = await r.json()
        ws = await self.session.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0)
        page = Page(ws)
        self._pages.append(page)
        for domain in ("Page", "Runtime", "Log"):
            await page.send(f"{domain}.enable")
        return page
