"""``GET /v1/jobs/<id>/view``: everything the web view's job page shows, in one answer (issue 31: the
page fetched the job, its recovery, the whole cluster grid and the slow-node list, then the job's
slow-node status, and showed "loading..." in between).

``{"job": <the /v1/jobs/<id> object: ranks, health, faults, state, strategies ...>, "recovery":
<the /v1/jobs/<id>/recovery object: state, flow, registered, subscribed, decisions ...>, "cells":
{node: {npu id (str): {level, health, faults, codes}}} (the /v1/grid cells of the job's nodes, an
NPU with no fault and no report absent), "slownode": <the /v1/slownode/<job> status, or null when
slow-node detection is not enabled for the job>}``, or 404 for a job clusterd does not know.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from aiohttp import web

from faultmesh.httpd import found_or_404

Body = dict[str, Any]


class JobView:
    """The one-fetch job page (module docstring) over callables: ``page(id)`` the brain's part,
    ``{"job", "recovery"}``, or None (unknown job), ``cells(nodes)`` the grid rows of those
    nodes (:meth:`clusterd.http.web.WebUi.grid`'s ``nodes``), ``slownode(id, name)`` its slow-node
    status or None."""

    def __init__(
        self,
        page: Callable[[str], Body | None],
        cells: Callable[[Iterable[str]], Body],
        slownode: Callable[[str, str], Body | None],
    ) -> None:
        self.page = page
        self.cells = cells
        self.slownode = slownode

    def add_routes(self, router: web.UrlDispatcher) -> None:
        """Register ``GET /v1/jobs/{id}/view``."""
        router.add_get("/v1/jobs/{id}/view", self.view)

    def body(self, jid: str) -> Body | None:
        """The page's object for job ``jid`` (module docstring), or None for an unknown job."""
        body = self.page(jid)
        if body is None:
            return None
        job = body["job"]
        grid = self.cells({r["node"] for r in job["ranks"]})
        body["cells"] = {n["name"]: n["npus"] for n in grid["nodes"]}
        body["slownode"] = self.slownode(job["id"], job["name"])
        return body

    async def view(self, request: web.Request) -> web.Response:
        jid = request.match_info["id"]
        return found_or_404(self.body(jid), f"job {jid} not found")
