"""HTTP control API of the ``sim`` backend (JSON in, JSON out), for demos and scripts.

Mounted on ``--sim-control-addr`` (or on deviced's ``--http-addr`` when that flag is unset).
Device ids are logic ids (= physical ids in the simulator). Codes are hex strings.

- ``GET  /sim/devices`` -> ``[{logic_id, phy_id, codes, dropped, network, procs, boot, resets}]``
- ``POST /sim/fault  {"device": 0, "code": "80E18008", "assertion": "occur"|"recover"|"once", "severity": 2}``
- ``POST /sim/link   {"device": 0, "state": "down"|"up"}``              (81078603 occur / recover)
- ``POST /sim/probe  {"device": 0, "result": 3}``                       (gateway probe; 0/6 healthy)
- ``POST /sim/card   {"device": 0, "state": "drop"|"back"}``            (health -8012 while dropped)
- ``POST /sim/procs  {"device": 0, "count": 0}``                        (processes on the chip)
- ``POST /sim/switch {"alarm": "0x00f1fef5", "fault_id": 155914 | "na", "peer": "npu"|"cpu"|"L2"|int,
  "peer_port": 0, "chip": 0, "port": 3, "severity": 2, "assertion": "occur"|"recover"}``
- ``GET  /sim/switch`` -> current switch faults

Bad input answers 400 with ``{"error": ...}``. Example: ``curl -s -XPOST localhost:PORT/sim/link
-d '{"device":5,"state":"down"}'``. The CLI ``faultmesh device-sim`` wraps these calls.
"""

from __future__ import annotations

import asyncio

from deviced.backends import SimBackend
from deviced.tables import parse_code
from faultmesh.httplite import App, Request, Response, json_response

ASSERTIONS = {"recover": 0, "occur": 1, "once": 2}
PEERS = {"cpu": 0, "npu": 1, "l2": 2, "na": 0xFFFF}


class BadRequest(ValueError):
    """Rejected control input (answered 400)."""


def _device(sim: SimBackend, body: dict) -> int:
    dev = body.get("device")
    if not isinstance(dev, int) or dev not in sim.devs:
        raise BadRequest(f"unknown device {dev!r}; devices are {sorted(sim.devs)}")
    return dev


def add_routes(app: App, sim: SimBackend) -> None:
    """Add the /sim routes for ``sim`` to an agent HTTP application (:class:`faultmesh.httplite.App`, before it starts)."""

    async def body_of(request: Request) -> dict:
        try:
            body = await request.json()
        except ValueError as e:
            raise BadRequest(f"body is not JSON: {e}") from None
        if not isinstance(body, dict):
            raise BadRequest("body must be a JSON object")
        return body

    def handler(fn):
        async def wrapped(request: Request) -> Response:
            try:
                body = await body_of(request) if request.method == "POST" else {}
                result = await fn(body)
            except (BadRequest, KeyError, TypeError, ValueError) as e:
                return json_response({"error": str(e)}, status=400)
            return json_response(result)

        return wrapped

    async def devices(_body):
        return sim.state()

    async def fault(body):
        dev = _device(sim, body)
        code = parse_code(str(body.get("code", "")))
        if code > 0xFFFFFFFF and not getattr(sim, "wide_codes", False):  # a DCMI event id is 32 bits
            raise BadRequest(f"fault code {body.get('code')!r} does not fit 32 bits (a DCMI event id)")
        assertion = ASSERTIONS[str(body.get("assertion", "occur"))]
        severity = int(body.get("severity", 2))
        await asyncio.to_thread(sim.inject, dev, code, assertion, severity)
        return {"ok": True}

    async def link(body):
        dev = _device(sim, body)
        state = body.get("state")
        if state not in ("down", "up"):
            raise BadRequest("state must be down or up")
        await asyncio.to_thread(sim.link, dev, state == "up")
        return {"ok": True}

    async def probe(body):
        dev = _device(sim, body)
        sim.probe(dev, int(body.get("result", 0)))
        return {"ok": True}

    async def card(body):
        dev = _device(sim, body)
        state = body.get("state")
        if state not in ("drop", "back"):
            raise BadRequest("state must be drop or back")
        sim.card(dev, state == "drop")
        return {"ok": True}

    async def procs(body):
        dev = _device(sim, body)
        n = int(body.get("count", 0))
        if n < 0:
            raise BadRequest("count must be >= 0")
        sim.set_procs(dev, n)
        return {"ok": True}

    async def switch(body):
        alarm = parse_code(str(body.get("alarm", "")))
        fid = body.get("fault_id", "na")
        fault_id = 0xFFFFFFFF if fid == "na" else int(fid)
        peer = body.get("peer", "na")
        peer_t = PEERS[peer.lower()] if isinstance(peer, str) else int(peer)
        args = (
            alarm,
            fault_id,
            peer_t,
            int(body.get("peer_port", 0)),
            int(body.get("chip", 0)),
            int(body.get("port", 0)),
            int(body.get("severity", 2)),
            ASSERTIONS[str(body.get("assertion", "occur"))],
        )
        await asyncio.to_thread(sim.switch.fire, *args)
        return {"ok": True}

    async def switch_list(_body):
        return [ev._asdict() for ev in sim.switch.fault_info()]

    app.router.add_get("/sim/devices", handler(devices))
    app.router.add_post("/sim/fault", handler(fault))
    app.router.add_post("/sim/link", handler(link))
    app.router.add_post("/sim/probe", handler(probe))
    app.router.add_post("/sim/card", handler(card))
    app.router.add_post("/sim/procs", handler(procs))
    app.router.add_post("/sim/switch", handler(switch))
    app.router.add_get("/sim/switch", handler(switch_list))
