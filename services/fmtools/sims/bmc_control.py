"""The BMC simulator's run-time control API (JSON over HTTP on 127.0.0.1; see :mod:`fmtools.sims.bmc`).

Endpoints: ``GET /state``; ``POST /alarms``, ``/alarms/clear``, ``/sel``, ``/sel/clear``, ``/reset``,
``/behaviour``. A bad request is answered 400 with ``{"error": ...}``.
"""

from __future__ import annotations

import json
import logging
from http.server import BaseHTTPRequestHandler
from typing import Any

from faultmesh.log import event
from noded.bmc import oem, sel

log = logging.getLogger("fmtools.sims.bmc")

OEM_MODES = ("ok", "unsupported", "busy-once", "short", "ragged", "absurd", "count")


def _type_byte(v) -> int:
    return oem.device_type_byte(v if isinstance(v, int) else str(v))


def make_control_handler(state: Any):
    """An http.server handler class serving the control API on ``state`` (a
    :class:`fmtools.sims.bmc.SimState`)."""

    class Handler(BaseHTTPRequestHandler):
        server_version = "faultmesh-bmc-sim"

        def log_message(self, fmt, *args):  # quiet; events are logged explicitly
            pass

        def _send(self, status: int, body) -> None:
            raw = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def _body(self) -> dict:
            n = int(self.headers.get("Content-Length") or 0)
            if n > 1 << 20:
                raise ValueError("body too large")
            doc = json.loads(self.rfile.read(n) or b"{}")
            if not isinstance(doc, dict):
                raise ValueError("body must be a JSON object")
            return doc

        def do_GET(self):
            if self.path == "/state":
                return self._send(200, state.snapshot())
            return self._send(404, {"error": "not found"})

        def do_POST(self):
            try:
                body = self._body()
                if self.path == "/alarms":
                    code = str(body["code"])
                    if len(code) != 8:
                        raise ValueError("code must be 8 hex digits")
                    int(code, 16)
                    n = state.add_alarms(
                        code,
                        _type_byte(body.get("device_type", 0x2C)),
                        int(body.get("device_id", 0)),
                        int(body.get("severity", 2)),
                        int(body.get("count", 1)),
                    )
                    event(log, logging.INFO, "bmc-sim alarms injected", code=code.upper(), total=n)
                    return self._send(200, {"alarms": n})
                if self.path == "/alarms/clear":
                    dt = body.get("device_type")
                    did = body.get("device_id")
                    removed = state.clear_alarms(
                        body.get("code"),
                        None if dt is None else _type_byte(dt),
                        None if did is None else int(did),
                    )
                    event(log, logging.INFO, "bmc-sim alarms cleared", removed=removed)
                    return self._send(200, {"removed": removed})
                if self.path == "/sel":
                    if "raw" in body:
                        rec = bytes.fromhex(str(body["raw"]))
                        if len(rec) != 16:
                            raise ValueError("raw SEL record must be 16 bytes")
                    else:
                        rec = sel.make_event_record(
                            int(body["sensor_type"]),
                            int(body.get("sensor_num", 0)),
                            int(body["offset"]),
                            event_type=int(body.get("event_type", 0x6F)),
                            deassert=bool(body.get("deassert", False)),
                        )
                    rid = state.add_sel(rec)
                    event(log, logging.INFO, "bmc-sim sel event added", record_id=rid)
                    return self._send(200, {"record_id": rid})
                if self.path == "/sel/clear":
                    state.clear_sel()
                    event(log, logging.INFO, "bmc-sim sel cleared")
                    return self._send(200, {"cleared": True})
                if self.path == "/reset":
                    state.reset()
                    event(log, logging.INFO, "bmc-sim reset")
                    return self._send(200, {"reset": True})
                if self.path == "/behaviour":
                    with state.lock:
                        if "delay_s" in body:
                            state.delay_s = max(0.0, float(body["delay_s"]))
                        if "drop" in body:
                            state.drop = bool(body["drop"])
                        if "oem" in body:
                            if body["oem"] not in OEM_MODES:
                                raise ValueError(f"oem must be one of {OEM_MODES}")
                            state.oem_mode = body["oem"]
                        if "power_on" in body:
                            state.power_on = bool(body["power_on"])
                        if "serial" in body:
                            state.serial = str(body["serial"])
                    return self._send(200, state.snapshot()["behaviour"])
                return self._send(404, {"error": "not found"})
            except KeyError as e:  # a required field left out
                return self._send(400, {"error": f"missing field {e}"})
            except (ValueError, TypeError, OverflowError) as e:
                return self._send(400, {"error": str(e)})

    return Handler
