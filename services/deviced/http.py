"""deviced's HTTP API (besides ``/metrics``, ``/healthz``, ``/readyz``):

- ``GET /v1/devices`` -> ``{"node", "subscribed", "devices": [...]}``: every chip with ids, health,
  levels, codes (level, plane, first seen ms) and escalations (:func:`device_views`).

This port is not authenticated, so it changes nothing: an operator releases a ManuallySeparateNPU
chip through clusterd's authenticated API (``faultmesh release npu NODE/PHY``), which reaches deviced
as a ``release`` control message on the agent stream (:func:`deviced.control.release_device`).
"""

from __future__ import annotations

import logging
from typing import Any

from deviced.engine import FaultEngine
from deviced.faults import code_name, plane
from faultmesh.httplite import App, Request, Response, json_response

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


def add_routes(app: App, engine: FaultEngine, node: str) -> None:
    """Add the read-only /v1/devices route."""

    async def devices(_request: Request) -> Response:
        return json_response({"node": node, "subscribed": engine.subscribed, "devices": device_views(engine)})

    app.router.add_get("/v1/devices", devices)
