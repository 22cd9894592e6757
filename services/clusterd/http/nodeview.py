"""``GET /v1/nodes/<name>/view``: everything the web view's node page shows, in one answer (issue 31:
the page fetched the node, then each code's meaning, then the history, and showed "loading..." in
between).

``{"node": <the /v1/nodes/<name> object, each fault with its "ack">, "meanings": {code: {name,
impact, handling, module, ...} or null}, "handling": {level: text}, "events": <the node's newest
200 history rows, oldest first, as /v1/events>, "jobs": [{id, name, namespace, ranks: [rank...],
touched: [{rank, device_id, codes}]}]}``, or 404 for a node clusterd does not know.

``jobs``: every job with a rank on the node; ``touched``: its ranks there that a fault reaches: a
fault on an NPU reaches the rank on that NPU, a fault on the node itself (device -1, or a device that
is not an NPU) reaches every rank on the node.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from aiohttp import web

from clusterd.audit import with_why
from clusterd.http.nodes import NodeApi
from clusterd.store import Store
from faultmesh import faultinfo
from faultmesh.httpd import json_response
from faultmesh.jobspec import Job

EVENTS = 200
"""History rows the page shows at most."""


def meaning_json(code: str) -> dict[str, Any] | None:
    """faultmesh's description of ``code`` (:func:`faultmesh.faultinfo.explain`'s meaning), or None for
    a code it does not describe or that is not a code (``ManuallySeparateNPU``)."""
    try:
        m = faultinfo.explain(code).meaning
    except ValueError:
        return None
    return dataclasses.asdict(m) if m else None


def touched(job: Job, node: str, faults: list[dict[str, Any]]) -> dict[str, Any]:
    """``job`` as the page lists it: its ranks on ``node`` and those the node's ``faults`` reach."""
    whole = sorted({f["code"] for f in faults if f["device_type"] != "NPU" or f["device_id"] < 0})
    by_dev: dict[int, set[str]] = {}
    for f in faults:
        if f["device_type"] == "NPU" and f["device_id"] >= 0:
            by_dev.setdefault(f["device_id"], set()).add(f["code"])
    here = sorted((r for r in job.ranks if r.node == node), key=lambda r: r.rank)
    hit = [
        {
            "rank": r.rank,
            "device_id": r.device_id,
            "codes": sorted(by_dev.get(r.device_id, set()) | set(whole)),
        }
        for r in here
        if whole or r.device_id in by_dev
    ]
    return {"id": job.id, "name": job.name, "namespace": job.namespace, "ranks": [r.rank for r in here],
            "touched": hit}  # fmt: skip


class NodeView:
    """The one-fetch node page (module docstring) over the node API, the store's history and the job
    registry's ``jobs_on_node``."""

    def __init__(self, nodes: NodeApi, store: Store, jobs_on_node: Callable[[str], list[Job]]) -> None:
        self.nodes = nodes
        self.store = store
        self.jobs_on_node = jobs_on_node

    def add_routes(self, router: web.UrlDispatcher) -> None:
        """Register ``GET /v1/nodes/{name}/view``."""
        router.add_get("/v1/nodes/{name}/view", self.view)

    async def view(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        node = self.nodes.node_body(name)
        if node is None:
            return json_response({"error": f"node {name} not known"}, status=404)
        faults = node["fault_list"]
        return json_response(
            {
                "node": node,
                "meanings": {c: meaning_json(c) for c in sorted({f["code"] for f in faults})},
                "handling": {
                    lv: faultinfo.level_handling(lv)[0] for lv in sorted({f["level"] for f in faults})
                },
                "events": with_why(await self.store.query_events(name, None, 0, EVENTS)),
                "jobs": [touched(j, name, faults) for j in self.jobs_on_node(name)],
            }
        )
