"""The web view served by ClusterD on its HTTP port (issue 17), read-only (GET only: no token needed).

Pages (one HTML shell, ``web/page.html``, with ``web/app.js`` and ``web/style.css``; the script picks
the view from the path; no build step, charts are small hand-written SVG):

- ``GET /``: the cluster as a grid of nodes x NPUs coloured by health / worst level, live;
- ``GET /ui/node/<name>``: the node's faults with their meaning, handling and acknowledgement, the
  jobs they touch (linked), agents, conditions, history; from one fetch of ``GET
  /v1/nodes/<name>/view`` (:mod:`clusterd.http.nodeview`);
- ``GET /ui/jobs``: every job with its health, faults and recovery state, each linked to its page;
- ``GET /ui/job/<id>``: ranks on nodes (coloured by their NPU's health, its faults on hover), the
  recovery state and decisions as a timeline, slow-node rounds and the per-rank compute / wait ratio
  plot (from the node results' ``pattern``) when the job has them; from one fetch of ``GET
  /v1/jobs/<id>/view`` (:mod:`clusterd.http.jobview`);
- ``GET /ui/pingmesh``: each super pod's node-to-node link matrix as a heat map (loss rate).
- ``GET /ui/static/<file>``: the shipped files (package data ``clusterd/web``).

Every page marks itself rendered with ``body[data-ready="1"]`` (the Chromium tests wait on it).
JSON used only by the pages: ``GET /v1/grid`` (see :meth:`WebUi.grid`: a cell's faults are its
hover and focus text), ``GET /v1/faultinfo/<code>``
(:func:`faultmesh.faultinfo.explain` as JSON, 400 for a malformed code) and ``GET /v1/stream``, a
server-sent-events stream of the fault center: one ``change`` event per committed batch (data: a
JSON list of ``{kind, node, device_type, device_id, code, level}``), a ``: keepalive`` comment every
15 s. Each browser has a bounded queue (64 batches); a browser that falls behind misses batches and
gets a ``resync`` event instead (the page refetches the grid on any event, so it converges).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Iterable, Sequence
from importlib import resources
from typing import Any

import orjson
from aiohttp import web

from clusterd.acks import AckOf, no_ack
from clusterd.center import FaultCenter
from clusterd.ingest.agents import AgentHub
from clusterd.nodes import NodeRegistry
from faultmesh import faultinfo
from faultmesh.httpd import json_response
from faultmesh.levels import level_health, level_severity, worst_health
from faultmesh.model import Change, Fault
from faultmesh.runtime import wait_for

STATIC = resources.files("clusterd").joinpath("web")
_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}
KEEPALIVE_S = 15.0
CLIENT_QUEUE = 64
_CLOSE: Any = object()
_RESYNC: Any = object()


CELL_CODES = 8
"""The most faults a grid cell lists for its hover text (the worst levels)."""


def _worst_first(codes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(codes, key=lambda c: (-level_severity(c["level"]), c["code"]))[:CELL_CODES]


def _static(name: str) -> web.Response:
    ext = name[name.rfind(".") :] if "." in name else ""
    if "/" in name or name.startswith(".") or ext not in _TYPES:
        raise web.HTTPNotFound()
    f = STATIC.joinpath(name)
    if not f.is_file():
        raise web.HTTPNotFound()
    return web.Response(body=f.read_bytes(), content_type=_TYPES[ext], headers={"Cache-Control": "no-cache"})


class WebUi:
    """The pages, ``/v1/grid``, ``/v1/faultinfo/<code>`` and the live ``/v1/stream``."""

    def __init__(
        self, center: FaultCenter, nodes: NodeRegistry, agents: AgentHub, ack_of: AckOf = no_ack
    ) -> None:
        """``ack_of``: the acknowledgement that covers a fault, or None (:mod:`clusterd.acks`)."""
        self.center = center
        self.ack_of = ack_of
        self.nodes = nodes
        self.agents = agents
        self._clients: set[asyncio.Queue] = set()
        center.subscribe("web", self._publish, resync=self._resync)

    def add_routes(self, app: web.Application) -> None:
        """Register the routes of the module docstring and close open streams on shutdown."""
        r = app.router
        for path in ("/", "/ui/node/{name}", "/ui/jobs", "/ui/job/{id}", "/ui/pingmesh"):
            r.add_get(path, self._page)
        r.add_get("/ui/static/{file}", self._file)
        r.add_get("/v1/grid", self._grid)
        r.add_get("/v1/faultinfo/{code}", self._faultinfo)
        r.add_get("/v1/stream", self._stream)
        app.on_shutdown.append(self._close_streams)

    # -- pages ------------------------------------------------------------------------------------
    async def _page(self, request: web.Request) -> web.Response:
        return _static("page.html")

    async def _file(self, request: web.Request) -> web.Response:
        return _static(request.match_info["file"])

    # -- JSON ---------------------------------------------------------------------------------------
    def grid(self, only: Iterable[str] | None = None) -> dict[str, Any]:
        """``{"npus": [ids], "nodes": [{name, health, worst_level, faults, agents, node_faults,
        node_level, node_level_health, node_codes, npus: {id: {level, health, faults, codes}}}]}``:
        every node known
        from faults, agents or the registry, each NPU with its worst active fault (level "" and
        health Healthy when none; a device the agent reported unhealthy keeps that health);
        ``node_level`` / ``node_level_health``: the worst level of the faults that are not on an NPU
        and the health it maps to (issue 31: the node-level cell is coloured by that, not by the
        node's health, which NPU faults also raise); ``codes`` / ``node_codes``: the cell's faults
        (:meth:`cell_code`, at most :data:`CELL_CODES`, worst first) for its hover text. ``only``:
        just these nodes (the job page's)."""
        connected: dict[str, list[str]] = {}
        for n, a in self.agents.connected():
            connected.setdefault(n, []).append(a)
        names = self.nodes.all_names() | self.center.node_names() | set(connected)
        if only is not None:
            names &= set(only)
        ids: set[int] = set()
        out = []
        for name in sorted(names):
            npus: dict[int, dict[str, Any]] = {}
            st = self.nodes.get(name)
            for d in st.devices.values() if st else ():
                if d.get("device_type") == "NPU" and isinstance(d.get("device_id"), int):
                    npus[d["device_id"]] = {
                        "level": "",
                        "health": d.get("health") or "Healthy",
                        "faults": 0,
                        "codes": [],
                    }
            node_faults, node_codes = 0, []
            node_level, node_healths = "", []
            for f in self.center.faults_of_node(name):
                if f.device_type != "NPU" or f.device_id < 0:
                    node_faults += 1
                    node_healths.append(level_health(f.level))
                    node_codes.append(self.cell_code(f))
                    if not node_level or level_severity(f.level) > level_severity(node_level):
                        node_level = f.level
                    continue
                cell = npus.setdefault(
                    f.device_id, {"level": "", "health": "Healthy", "faults": 0, "codes": []}
                )
                cell["faults"] += 1
                cell["codes"].append(self.cell_code(f))
                if not cell["level"] or level_severity(f.level) > level_severity(cell["level"]):
                    cell["level"] = f.level
                cell["health"] = worst_health([cell["health"], level_health(f.level)])
            ids.update(npus)
            for cell in npus.values():
                cell["codes"] = _worst_first(cell["codes"])
            health, worst = self.nodes.health(name)
            out.append(
                {
                    "name": name,
                    "health": health,
                    "worst_level": worst,
                    "faults": len(self.center.faults_of_node(name)),
                    "node_faults": node_faults,
                    "node_level": node_level,
                    "node_level_health": worst_health(node_healths),
                    "node_codes": _worst_first(node_codes),
                    "agents": sorted(connected.get(name, [])),
                    "npus": {str(k): v for k, v in sorted(npus.items())},
                }
            )
        return {"npus": sorted(ids) or list(range(8)), "nodes": out}

    def cell_code(self, f: Fault) -> dict[str, Any]:
        """One fault of a grid cell: ``{code, name, level, handling, acked}`` (``handling``: what the
        level does, :func:`faultmesh.faultinfo.level_handling`; ``acked``: who acknowledged it, "" when
        nobody)."""
        ack = self.ack_of(f)
        return {
            "code": f.code,
            "name": faultinfo.short_name(f.code),
            "level": f.level,
            "handling": faultinfo.level_handling(f.level)[0],
            "acked": ack["by"] if ack else "",
        }

    async def _grid(self, request: web.Request) -> web.Response:
        return json_response(self.grid())

    async def _faultinfo(self, request: web.Request) -> web.Response:
        try:
            ex = faultinfo.explain(request.match_info["code"])
        except ValueError as e:
            return json_response({"error": str(e)}, status=400)
        m = ex.meaning
        return json_response(
            {
                "code": ex.code,
                "known": ex.known,
                "meaning": dataclasses.asdict(m) if m else None,
                "levels": [dataclasses.asdict(lv) for lv in ex.levels],
            }
        )

    # -- live stream --------------------------------------------------------------------------------
    def _offer(self, item: Any) -> None:
        for q in list(self._clients):
            try:
                q.put_nowait(item)
            except asyncio.QueueFull:  # this browser is behind: drop its backlog, tell it to refetch
                while not q.empty():
                    q.get_nowait()
                q.put_nowait(_RESYNC)

    def _publish(self, changes: Sequence[Change]) -> None:
        if self._clients:
            self._offer(
                [
                    {
                        "kind": c.kind,
                        "node": c.fault.node,
                        "device_type": c.fault.device_type,
                        "device_id": c.fault.device_id,
                        "code": c.fault.code,
                        "level": c.fault.level,
                    }
                    for c in changes
                ]
            )

    def _resync(self, faults) -> None:
        self._offer(_RESYNC)

    async def _close_streams(self, app: web.Application) -> None:
        for q in list(self._clients):
            with contextlib.suppress(asyncio.QueueFull):
                q.put_nowait(_CLOSE)

    async def _stream(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",
            }
        )
        await resp.prepare(request)
        q: asyncio.Queue = asyncio.Queue(maxsize=CLIENT_QUEUE)
        self._clients.add(q)
        try:
            await resp.write(b"retry: 2000\nevent: hello\ndata: {}\n\n")
            while True:
                try:
                    item = await wait_for(q.get(), KEEPALIVE_S)
                except TimeoutError:
                    await resp.write(b": keepalive\n\n")
                    continue
                if item is _CLOSE:
                    break
                if item is _RESYNC:
                    await resp.write(b"event: resync\ndata: {}\n\n")
                else:
                    await resp.write(b"event: change\ndata: " + orjson.dumps(item) + b"\n\n")
        except ConnectionResetError:  # the browser went away
            pass
        finally:
            self._clients.discard(q)
        return resp
