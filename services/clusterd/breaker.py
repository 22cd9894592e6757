"""The isolation circuit breaker (issue 30): one guard for every path of ClusterD that takes capacity
away from the scheduler — the cluster-info documents Volcano schedules by (a node published with an
unhealthy NPU or an UnHealthy status, :mod:`clusterd.kube.publisher`), the manual-separation policy
(:mod:`clusterd.separation`) and the ``isolate`` ranks of a job's reset-config
(:mod:`clusterd.kube.handoff`). The node taints keep their own breaker (``--kube-taint-max-share``).

A path asks :meth:`IsolationBreaker.admit` before it newly isolates a node. Within any
``--isolation-window-s`` (600 s) at most ``--isolation-max-share`` of the nodes ClusterD knows may be
newly isolated; past that the breaker opens: further isolations are held (the path keeps its last
published state; the faults are still recorded and shown by every view), logged once per opening
(``isolation breaker open``), and ``faultmesh_isolation_breaker_open`` = 1 (alert
``FaultmeshIsolationBreakerOpen`` in the chart), ``faultmesh_isolation_held_nodes`` counts the held nodes.
A node that stops being isolated is forgotten (its hold ends; with none held the breaker is closed).
A node already published isolated when ClusterD starts keeps its isolation (:meth:`adopt`). An operator who has checked the faults
releases the breaker (``faultmesh release breaker --reason ...``, ``POST /v1/release/breaker``, the
bearer token): the held nodes are admitted and the window starts over. The default share 1.0 turns
it off; the chart sets 0.2 (a bad fault-table push or agent release raises one code on every node at
once; real hardware faults isolate a few nodes an hour).
"""

from __future__ import annotations

import argparse
import logging
import time
from collections import deque
from collections.abc import Callable

import orjson
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge

from clusterd.audit import TokenName, operator_note, operator_row, record
from clusterd.store import Store
from faultmesh.config import number_in
from faultmesh.httpd import json_response
from faultmesh.log import event

log = logging.getLogger("clusterd.breaker")

RELEASE_CODE = "IsolationBreaker"
"""The code of the history row a breaker release writes per released node."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--isolation-max-share``, ``--isolation-window-s``."""
    g = parser.add_argument_group("isolation circuit breaker")
    g.add_argument(
        "--isolation-max-share",
        type=number_in(float, 0.0, 1.0),
        default=1.0,
        help="newly isolated nodes within the window may be at most this share of the known nodes; "
        "more are held until an operator releases the breaker (1.0: off)",
    )
    g.add_argument(
        "--isolation-window-s", type=number_in(float, 1.0, 86400.0), default=600.0, help="breaker window (s)"
    )


class IsolationBreaker:
    """See the module docstring. ``total()``: the nodes ClusterD knows; ``token_name``: the verified name
    of the bearer token a request carries (:meth:`clusterd.auth.TokenAuth.token_name`, for the
    release's note; None: no token checked); ``clock``: monotonic s. ``on_release``:
    callables given the released nodes (the paths re-evaluate them); ``store``: where a release
    writes one fault-history row per released node (kind ``release``, code :data:`RELEASE_CODE`, the
    note as attributes: who, from where, why), none when None."""

    def __init__(
        self,
        share: float,
        window_s: float,
        total: Callable[[], int],
        registry: CollectorRegistry,
        token_name: TokenName | None = None,
        clock: Callable[[], float] = time.monotonic,
        store: Store | None = None,
    ) -> None:
        self.share = share
        self.store = store
        self.token_name = token_name
        self.on_release: list[Callable[[list[str]], None]] = []
        self.window_s = window_s
        self._total = total
        self.clock = clock
        self._recent: deque[tuple[float, str]] = deque()  # (admitted at, node) within the window
        self.isolated: set[str] = set()  # nodes admitted as isolated (until forgotten)
        self.held: dict[str, set[str]] = {}  # node -> paths holding it back; open while not empty
        Gauge(
            "faultmesh_isolation_breaker_open", "1 while isolations are held", registry=registry
        ).set_function(lambda: int(self.open))
        Gauge(
            "faultmesh_isolation_held_nodes", "Nodes whose isolation is held", registry=registry
        ).set_function(lambda: len(self.held))
        self.m_held = Counter(
            "faultmesh_isolations_held_total",
            "Isolations held by the breaker, by path",
            ["path"],
            registry=registry,
        )

    @property
    def enabled(self) -> bool:
        """False with a share of 1.0 (every isolation admitted, nothing to track)."""
        return self.share < 1.0

    @property
    def open(self) -> bool:
        """True while isolations are held."""
        return bool(self.held)

    def adopt(self, node: str) -> None:
        """``node`` was isolated before this process started (published so, or stored): it stays
        isolated without taking room in the window (a restart must not release what was isolated)."""
        self.isolated.add(node)
        self.held.pop(node, None)

    def limit(self) -> int:
        """How many nodes may be newly isolated within the window (at least 1)."""
        return max(1, int(self.share * max(1, self._total())))

    def admit(self, node: str, path: str) -> bool:
        """May ``path`` isolate ``node`` now? True when it already is, or the window has room; else the
        isolation is held (counted, and the breaker opens)."""
        if not self.enabled or node in self.isolated:
            return True
        now = self.clock()
        while self._recent and self._recent[0][0] <= now - self.window_s:
            self._recent.popleft()
        if len(self._recent) < self.limit():
            self._recent.append((now, node))
            self.isolated.add(node)
            return True
        opening = not self.held
        paths = self.held.setdefault(node, set())
        if path not in paths:
            paths.add(path)
            self.m_held.labels(path).inc()
        if opening:
            event(log, logging.ERROR, "isolation breaker open", node=node, path=path, limit=self.limit(),
                  window_s=self.window_s, known_nodes=self._total())  # fmt: skip
        return False

    def forget(self, node: str) -> None:
        """``node`` is not isolated any more (its faults recovered): its hold ends."""
        self.isolated.discard(node)
        self.held.pop(node, None)

    def release(self, note: dict[str, str]) -> list[str]:
        """An operator releases the breaker: the held nodes are admitted, the window starts over.
        Returns the nodes released (the paths re-evaluate them)."""
        nodes = sorted(self.held)
        self.isolated.update(nodes)
        self.held.clear()
        self._recent.clear()
        event(log, logging.WARNING, "isolation breaker released", nodes=len(nodes), **note)
        return nodes

    async def http_release(self, request: web.Request) -> web.Response:
        """``POST /v1/release/breaker`` (body ``{"reason": ..., "by": ...}``, the reason required:
        400 without; the bearer token
        as every write): ``{"released": [nodes], "was_open": bool}``."""
        try:
            body = orjson.loads(await request.read() or b"{}")
        except ValueError:
            return json_response({"error": "body must be JSON"}, status=400)
        if not isinstance(body, dict):
            return json_response({"error": "body must be a JSON object"}, status=400)
        note = operator_note(request, body, self.token_name, reason_required=True)
        was = self.open
        nodes = self.release(note)
        for fn in self.on_release:
            fn(nodes)
        if self.store is not None:  # who and why in each released node's history (issue 31)
            await record(
                self.store, "release", [operator_row(n, "Node", -1, RELEASE_CODE, "", note) for n in nodes]
            )
        return json_response({"released": nodes, "was_open": was})

    def status(self) -> dict:
        """The breaker's state for ``GET /v1/breaker``."""
        return {"open": self.open, "held": sorted(self.held), "limit": self.limit(), "window_s": self.window_s,
                "max_share": self.share}  # fmt: skip

    def add_routes(self, router: web.UrlDispatcher) -> None:
        """``GET /v1/breaker`` (its state) and ``POST /v1/release/breaker``."""
        router.add_get("/v1/breaker", self.http_status)
        router.add_post("/v1/release/breaker", self.http_release)

    async def http_status(self, _request: web.Request) -> web.Response:
        """``GET /v1/breaker``: :meth:`status`."""
        return json_response(self.status())
