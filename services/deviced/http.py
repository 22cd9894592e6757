"""deviced's HTTP API (besides ``/metrics``, ``/healthz``, ``/readyz``):

- ``GET /v1/devices`` -> ``{"node", "subscribed", "devices": [...]}``: every chip with ids, health,
  levels, codes (level, plane, first seen ms) and escalations (:func:`device_views`).
- ``POST /v1/devices/<phy>/release`` -> ``{"phy_id", "released"}``: operator release of a
  ManuallySeparateNPU chip (the reference: deleting its name from the ConfigMap, §4.2); 400 for a
  non-integer id, 404 for an unknown chip.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from aiohttp import web

from deviced.engine import FaultEngine
from deviced.faults import code_name, plane
from faultmesh.httpd import json_response
from faultmesh.log import event

log = logging.getLogger("deviced")


def device_views(engine: FaultEngine) -> list[dict[str, Any]]:
    """Every chip as JSON: ids, health, levels, active codes (level, first seen ms), escalations."""
    out = []
    for logic, d in sorted(engine.devices.items()):
        worst = d.worst_level()
        out.append(
            {
                "logic_id": logic,
                "phy_id": d.ids.phy,
                "card_id": d.ids.card,
                "device_id": d.ids.device,
                "health": d.health,
                "network_health": d.network_health,
                "level": worst.name if worst is not None else "",
                "chip_level": d.level.name if d.level is not None else "",
                "network_level": d.network_level.name if d.network_level is not None else "",
                "in_use": d.in_use,
                "resetting": d.resetting,
                "manually_separated": d.manually_separated,
                "codes": [
                    {
                        "code": engine.table.spelling(c),
                        "level": engine.code_level(d, c).name,
                        "plane": plane(c),
                        "first_seen_ms": st.first_seen_ms,
                    }
                    for c, st in sorted(d.codes().items())
                ],
                "upgrades": [
                    {
                        "code": code_name(engine, r.code),
                        "level": r.level.name,
                        "type": r.kind,
                        "time_ms": r.time_ms,
                    }
                    for r in d.reasons.values()
                ],
            }
        )
    return out


def add_routes(app: web.Application, engine: FaultEngine, node: str, changed: Callable[[], None]) -> None:
    """Add the /v1/devices routes; ``changed()`` runs after an operator release (report + save)."""

    async def devices(_request: web.Request) -> web.Response:
        return json_response({"node": node, "subscribed": engine.subscribed, "devices": device_views(engine)})

    async def release(request: web.Request) -> web.Response:
        try:
            phy = int(request.match_info["phy"])
        except ValueError:
            return json_response({"error": "phy id must be an integer"}, status=400)
        logic = engine.logic_of_phy(phy)
        if logic is None:
            return json_response({"error": f"no chip with physical id {phy}"}, status=404)
        released = engine.release_manual(logic)
        event(log, logging.WARNING, "manual separation released by operator", phy_id=phy, released=released)
        changed()
        return json_response({"phy_id": phy, "released": released})

    app.router.add_get("/v1/devices", devices)
    app.router.add_post("/v1/devices/{phy}/release", release)
