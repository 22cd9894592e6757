"""Refused state writes on the HTTP API: one middleware for every route.

A handler whose store write raises ``sqlite3.Error`` (full disk, I/O error, lock timeout) answers
``503 {"error": "state write failed: <the store's error>"}``, the write is counted in
``faultmesh_store_errors_total`` (the chart's "state writes failing" alert) and logged once
(``state write failed``, with the route). The handlers change memory only after the store took the
change, so a 503 changed nothing and the client may retry. Routes that map the error themselves
(slow-node enable) are unaffected.
"""

from __future__ import annotations

import logging
import sqlite3

from aiohttp import web
from prometheus_client import Counter

from faultmesh.httpd import json_response
from faultmesh.log import event

log = logging.getLogger("clusterd.http")


def state_write_middleware(store_errors: Counter):
    """The aiohttp middleware of the module docstring; ``store_errors``: the fault center's
    ``faultmesh_store_errors_total``."""

    @web.middleware
    async def refused_state_write(request: web.Request, handler):
        try:
            return await handler(request)
        except sqlite3.Error as e:
            store_errors.inc()
            event(
                log,
                logging.ERROR,
                "state write failed",
                method=request.method,
                path=request.path[:200],
                error=str(e),
            )
            return json_response({"error": f"state write failed: {e}"}, 503)

    return refused_state_write
