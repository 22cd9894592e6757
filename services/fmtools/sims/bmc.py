"""``faultmesh bmc-sim``: an IPMI 2.0 lanplus BMC on loopback, built on pyghmi's BMC server.

It answers what noded and ``ipmitool`` use: Get Device ID (manufacturer 2011 = Huawei, so noded
picks the OEM path), Get Chassis Status / Chassis Control, the Huawei "get current alarms" OEM
command (netfn 0x30 cmd 0x94, paged as reference noded.md §1), the serial-number OEM command
(0x30 0x90, ``--serial``), and the SEL (Get SEL Info, Get SEL
Allocation Info, Reserve, Get/Add/Delete Entry, Clear, Get/Set SEL Time).

Run time control (a small JSON HTTP API on ``--control-address`` (127.0.0.1) ``--control-port``;
:mod:`fmtools.sims.bmc_control`; no authentication, so bind it beyond loopback only on a lab
network, as for a multi-host test where the injecting host is not the BMC's):

- ``GET /state`` -> alarms, SEL size, behaviour;
- ``POST /alarms`` ``{"code": "0800004B", "device_type": "PCIe Card"|8, "device_id": 3, "severity": 2,
  "count": 1}`` adds alarms (``count`` > 1 adds codes ``code+i`` on device ids ``device_id+i``);
- ``POST /alarms/clear`` ``{"code": ..., "device_type": ..., "device_id": ...}`` (all optional filters);
- ``POST /reset``: no alarms, empty SEL, default behaviour;
- ``POST /sel`` ``{"sensor_type": 12, "sensor_num": 16, "offset": 1, "event_type": 111,
  "deassert": false}`` appends a system event; ``POST /sel/clear``;
- ``POST /behaviour`` ``{"delay_s": 0, "drop": false, "oem": "ok"}``; ``oem`` is one of ``ok``,
  ``unsupported`` (completion code 0xC1, an old iBMC), ``busy-once`` (the next alarm query is
  answered 0xD5 "not supported in present state", then ``ok``), ``short``, ``ragged``, ``absurd``,
  ``count`` (malformed replies for bad-input tests); ``"serial": "..."`` sets the serial number.

pyghmi 1.6.19's server needs three fixes (reference ecosystem.md §2.2), applied here by subclassing:
(1) it accepts any cipher-suite proposal but only implements suite 3, so the pyghmi client's
SHA-256 proposal is answered with RMCP+ status 0x11 (no cipher suite match) and the client falls
back to SHA-1; (2) a new login from a known client address dropped that client's sessions on every
port, a stale packet called a missing ``ServerSession.sessionless_data``, and any exception ended
``listen()``; (3) Get Device ID packed 4-byte manufacturer and product ids (spec: 3 and 2).
"""

from __future__ import annotations

import logging
import signal
import struct
import sys
import threading
import time
from http.server import ThreadingHTTPServer

from faultmesh.log import event
from fmtools.sims.bmc_control import make_control_handler
from noded.bmc import oem, sel

log = logging.getLogger("fmtools.sims.bmc")

SEL_CAPACITY = 1000
LOOP_WAIT_S = 0.02


class SimState:
    """Everything the simulated BMC holds; all access under ``lock``.

    ``alarms``: list of :class:`noded.bmc.oem.AlarmRecord`; ``sel``: record id -> 16 bytes
    (insertion-ordered); ``delay_s``/``drop``/``oem_mode``: behaviour for bad-BMC tests.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.alarms: list[oem.AlarmRecord] = []
        self.sel: dict[int, bytes] = {}
        self.next_record_id = 1
        self.add_ts = 0
        self.erase_ts = int(time.time())
        self.reservation = 0
        self.sel_time_offset = 0
        self.power_on = True
        self.delay_s = 0.0
        self.drop = False
        self.oem_mode = "ok"
        self.requests = 0
        self.serial = self.initial_serial = "2102SIM0000001"

    # -- alarms ---------------------------------------------------------------------------------
    def add_alarms(self, code: str, type_byte: int, device_id: int, severity: int, count: int = 1) -> int:
        """Add ``count`` alarms; returns how many alarms the BMC now holds. Raises ``ValueError``
        when a field does not fit the iBMC alarm record (device id and severity are one byte, the
        ids ``device_id .. device_id+count-1`` included; ``count`` 1..1000)."""
        if not 1 <= count <= 1000:
            raise ValueError(f"count must be 1..1000, not {count}")
        if not 0 <= device_id <= 0xFF - (count - 1):
            raise ValueError(
                f"device_id must be 0..255 (with count {count}: at most {0x100 - count}), not {device_id}"
            )
        if not 0 <= severity <= 0xFF:
            raise ValueError(f"severity must be 0..255, not {severity}")
        base = int(code, 16)
        with self.lock:
            for i in range(count):
                self.alarms.append(
                    oem.AlarmRecord(f"{(base + i) & 0xFFFFFFFF:08X}", severity, type_byte, device_id + i)
                )
            return len(self.alarms)

    def clear_alarms(
        self, code: str | None = None, type_byte: int | None = None, device_id: int | None = None
    ) -> int:
        """Remove matching alarms (no filter = all); returns how many were removed."""
        with self.lock:
            keep = [
                a
                for a in self.alarms
                if not (
                    (code is None or a.code == code.upper())
                    and (type_byte is None or a.type_byte == type_byte)
                    and (device_id is None or a.device_id == device_id)
                )
            ]
            removed = len(self.alarms) - len(keep)
            self.alarms = keep
            return removed

    # -- SEL ------------------------------------------------------------------------------------
    def now(self) -> int:
        """The BMC's SEL clock (s since the epoch, shifted by Set SEL Time)."""
        return int(time.time()) + self.sel_time_offset

    def add_sel(self, record: bytes) -> int:
        """Append a 16-byte record (record id and, for timestamped types, time set by the BMC)."""
        with self.lock:
            if len(self.sel) >= SEL_CAPACITY:
                raise OverflowError("SEL full")
            rid = self.next_record_id
            self.next_record_id = rid + 1 if rid < 0xFFFE else 1
            rec = bytearray(record)
            struct.pack_into("<H", rec, 0, rid)
            if rec[2] < 0xE0:
                struct.pack_into("<I", rec, 3, self.now())
            self.sel[rid] = bytes(rec)
            self.add_ts = self.now()
            return rid

    def clear_sel(self) -> None:
        """Erase the SEL; the erase timestamp moves forward (Get SEL Info shows it)."""
        with self.lock:
            self.sel.clear()
            self.erase_ts = max(self.now(), self.erase_ts + 1)

    def reset(self) -> None:
        """Back to the start state: no alarms, empty SEL (an erase), default behaviour."""
        self.clear_sel()
        with self.lock:
            self.alarms = []
            self.delay_s, self.drop, self.oem_mode = 0.0, False, "ok"
            self.power_on = True
            self.requests = 0
            self.serial = self.initial_serial

    def snapshot(self) -> dict:
        """The state as JSON-able dict (``GET /state``)."""
        with self.lock:
            return {
                "alarms": [
                    {
                        "code": a.code,
                        "severity": a.severity,
                        "device_type": a.device_type,
                        "type_byte": a.type_byte,
                        "device_id": a.device_id,
                    }
                    for a in self.alarms
                ],
                "sel_entries": len(self.sel),
                "sel": [_sel_dict(r) for r in self.sel.values()],
                "behaviour": {"delay_s": self.delay_s, "drop": self.drop, "oem": self.oem_mode},
                "requests": self.requests,
                "power_on": self.power_on,
            }


def _sel_dict(raw: bytes) -> dict:
    r = sel.parse_record(raw)
    return {
        "record_id": r.record_id,
        "record_type": r.record_type,
        "timestamp": r.timestamp,
        "sensor_type": r.sensor_type,
        "sensor_num": r.sensor_num,
        "event_type": r.event_type,
        "offset": r.offset,
        "deassert": r.deassert,
        "raw": raw.hex(),
    }


def _patched_classes():
    """Build the pyghmi subclasses lazily (pyghmi is imported only by the simulator process)."""
    import pyghmi.ipmi.bmc as pbmc
    import pyghmi.ipmi.private.serversession as serversession
    import pyghmi.ipmi.private.session as ipmisession

    class SimServerSession(serversession.ServerSession):
        """pyghmi's server session with fixes (1) and (2) of the module docstring."""

        def create_open_session_response(self, request):
            # fix (1): only cipher suite 3 (HMAC-SHA1 auth + HMAC-SHA1-96 integrity) is implemented
            auth_algo = request[12] & 0x3F if len(request) > 12 else 1
            integ_algo = request[20] & 0x3F if len(request) > 20 else 1
            if auth_algo != 1 or integ_algo != 1:
                self.clientsessionid = request[4:8]
                return bytearray([request[0], 0x11, 0, 0]) + self.clientsessionid
            return super().create_open_session_response(request)

        def sessionless_data(self, data, sockaddr):
            # fix (2): a stale queued packet for this session is sessionless data for the BMC
            self.bmc.sessionless_data(data, sockaddr)

        def _handle_ipmi_packet(self, data, sockaddr=None, qent=None):
            # fix (2): a new IPMI 1.5 exchange from a client address with a session drops only
            # this port's session (pyghmi dropped the client's sessions on every port)
            if data[4] in (0, 2) and qent is not None and len(data) >= 13:
                seq, sid = struct.unpack("<II", bytes(data[5:13]))
                if seq == 0 and sid == 0 and qent[2] in ipmisession.Session.bmc_handlers:
                    handlers = ipmisession.Session.bmc_handlers.get(sockaddr, {})
                    handlers.pop(self.bmc.port, None)
                    if not handlers:
                        ipmisession.Session.bmc_handlers.pop(sockaddr, None)
                    server = ipmisession.Session.bmc_handlers[qent[2]][0]
                    server.pktqueue.append(qent)
                    server.process_pktqueue()
                    return None
            return super()._handle_ipmi_packet(data, sockaddr=sockaddr, qent=qent)

    serversession.ServerSession = SimServerSession  # used by IpmiServer.sessionless_data

    class SimBmc(pbmc.Bmc):
        """The simulated BMC: device id (fix 3), chassis, OEM alarms and serial, SEL."""

        def __init__(self, authdata, state: SimState, port: int, address: str) -> None:
            super().__init__(authdata, port=port, address=address)
            self.port = self.serversocket.getsockname()[1]  # port 0 -> the bound port
            self.state = state
            self.mfgid = oem.IANA  # Huawei (2011): noded takes the OEM alarm path
            self.prodid = 0x0001
            self.deviceid = 0x20

        # fix (3): spec layout of Get Device ID (3-byte manufacturer, 2-byte product id)
        def send_device_id(self, session):
            data = [self.deviceid, 0x80 | self.revision, self.firmwaremajor, self.firmwareminor, 0x02, 0x84]
            data += list(struct.pack("<I", self.mfgid)[:3]) + list(struct.pack("<H", self.prodid))
            session.send_ipmi_response(data=data)

        def get_power_state(self):
            return "on" if self.state.power_on else "off"

        def power_on(self):
            self.state.power_on = True

        def power_off(self):
            self.state.power_on = False

        def power_shutdown(self):
            self.state.power_on = False

        def power_cycle(self):
            self.state.power_on = True

        def power_reset(self):
            self.state.power_on = True

        def get_system_guid(self):
            return self.uuid

        def handle_raw_request(self, request, session):
            """Dispatch one request (after the configured delay; never answered with ``drop``)."""
            st = self.state
            netfn, cmd = request["netfn"], request["command"]
            with st.lock:
                st.requests += 1
                delay, drop, oem_mode = st.delay_s, st.drop, st.oem_mode
                if oem_mode == "busy-once" and netfn == oem.NETFN and cmd == oem.CMD:
                    st.oem_mode = "ok"  # the behaviour as the request arrived, not after its delay
            if drop:
                return None
            if delay > 0:
                time.sleep(delay)
            data = bytes(request.get("data") or b"")
            try:
                if netfn == oem.NETFN and cmd == oem.CMD:
                    return self._oem_alarms(data, session, oem_mode)
                if netfn == oem.NETFN and cmd == oem.CMD_GET_INFO:
                    return self._oem_info(data, session)
                if netfn == sel.NETFN_STORAGE:
                    return self._storage(cmd, data, session)
            except Exception as e:  # a simulator bug answers 0xFF, never kills the listener
                event(log, logging.ERROR, "bmc-sim request failed", netfn=netfn, cmd=cmd, error=repr(e))
                return session.send_ipmi_response(code=0xFF)
            return super().handle_raw_request(request, session)

        def _oem_info(self, data: bytes, session):
            if len(data) != 6 or data[:3] != b"\x05\x00\x03":
                return session.send_ipmi_response(code=0xCC)
            with self.state.lock:
                mode = self.state.oem_mode
                value = self.state.serial if data[3] == 0x04 else "Huawei" if data[3] == 0x00 else None
            if mode == "unsupported":
                return session.send_ipmi_response(code=0xC1)
            if value is None:
                return session.send_ipmi_response(code=0xCC)
            return session.send_ipmi_response(data=[0x00] + list(value.encode()))

        def _oem_alarms(self, data: bytes, session, mode: str):
            st = self.state
            try:
                index = oem.parse_request(data)
            except oem.OemReplyError:
                return session.send_ipmi_response(code=0xCC)
            with st.lock:
                alarms = list(st.alarms)
            if mode == "unsupported":
                return session.send_ipmi_response(code=0xC1)
            if mode == "busy-once":
                return session.send_ipmi_response(code=0xD5)
            page = alarms[index : index + oem.PAGE_RECORDS]
            reply = oem.encode_reply(len(alarms), page, more=index + len(page) < len(alarms))
            if mode == "short":
                reply = reply[:5]
            elif mode == "ragged":
                reply = reply + b"\x00" * 7
            elif mode == "absurd":
                reply = reply[:3] + struct.pack("<H", 0xFFFF) + reply[5:]
            elif mode == "count":
                reply = reply[:5] + bytes(((reply[5] + 1) & 0xFF,)) + reply[6:]
            return session.send_ipmi_response(data=list(reply))

        def _storage(self, cmd: int, data: bytes, session):
            st = self.state
            if cmd == sel.CMD_GET_SEL_INFO:
                with st.lock:
                    info = sel.SelInfo(
                        0x51, len(st.sel), 16 * (SEL_CAPACITY - len(st.sel)), st.add_ts, st.erase_ts, 0x0A
                    )
                return session.send_ipmi_response(data=list(sel.encode_sel_info(info)))
            if cmd == sel.CMD_GET_SEL_ALLOC:
                with st.lock:
                    used = len(st.sel)
                body = struct.pack("<HHHHB", SEL_CAPACITY, 16, SEL_CAPACITY - used, SEL_CAPACITY - used, 1)
                return session.send_ipmi_response(data=list(body))
            if cmd == sel.CMD_RESERVE_SEL:
                with st.lock:
                    st.reservation = (st.reservation % 0xFFFF) + 1
                    rid = st.reservation
                return session.send_ipmi_response(data=list(struct.pack("<H", rid)))
            if cmd == sel.CMD_GET_SEL_ENTRY:
                if len(data) < 6:
                    return session.send_ipmi_response(code=0xC7)
                _res, rid, offset, count = struct.unpack_from("<HHBB", data, 0)
                with st.lock:
                    ids = list(st.sel)
                    if not ids:
                        return session.send_ipmi_response(code=sel.CC_NOT_PRESENT)
                    if rid == sel.FIRST_RECORD:
                        rid = ids[0]
                    elif rid == sel.LAST_RECORD:
                        rid = ids[-1]
                    if rid not in st.sel:
                        return session.send_ipmi_response(code=sel.CC_NOT_PRESENT)
                    pos = ids.index(rid)
                    nxt = ids[pos + 1] if pos + 1 < len(ids) else sel.LAST_RECORD
                    rec = st.sel[rid]
                n = 16 if count == 0xFF else count
                return session.send_ipmi_response(
                    data=list(struct.pack("<H", nxt) + rec[offset : offset + n])
                )
            if cmd == sel.CMD_ADD_SEL_ENTRY:
                if len(data) != 16:
                    return session.send_ipmi_response(code=0xC7)
                try:
                    rid = st.add_sel(data)
                except OverflowError:
                    return session.send_ipmi_response(code=0xC4)
                return session.send_ipmi_response(data=list(struct.pack("<H", rid)))
            if cmd == sel.CMD_DELETE_SEL_ENTRY:
                if len(data) < 4:
                    return session.send_ipmi_response(code=0xC7)
                rid = struct.unpack_from("<H", data, 2)[0]
                with st.lock:
                    if rid == sel.FIRST_RECORD and st.sel:
                        rid = next(iter(st.sel))
                    elif rid == sel.LAST_RECORD and st.sel:
                        rid = list(st.sel)[-1]
                    if st.sel.pop(rid, None) is None:
                        return session.send_ipmi_response(code=sel.CC_NOT_PRESENT)
                return session.send_ipmi_response(data=list(struct.pack("<H", rid)))
            if cmd == sel.CMD_CLEAR_SEL:
                if len(data) < 6 or data[2:5] != b"CLR":
                    return session.send_ipmi_response(code=0xCC)
                if data[5] == 0xAA:
                    st.clear_sel()
                return session.send_ipmi_response(data=[0x01])
            if cmd == sel.CMD_GET_SEL_TIME:
                return session.send_ipmi_response(data=list(struct.pack("<I", st.now())))
            if cmd == sel.CMD_SET_SEL_TIME:
                if len(data) < 4:
                    return session.send_ipmi_response(code=0xC7)
                with st.lock:
                    st.sel_time_offset = struct.unpack_from("<I", data, 0)[0] - int(time.time())
                return session.send_ipmi_response()
            return session.send_ipmi_response(code=0xC1)

    return SimBmc, ipmisession


# -- control API ----------------------------------------------------------------------------------
def serve(
    port: int,
    user: str,
    password: str,
    control_port: int = 0,
    address: str = "127.0.0.1",
    preload_alarms: int = 0,
    ready_out=sys.stdout,
    serial: str = "",
    control_address: str = "127.0.0.1",
) -> None:
    """Run the simulator until the process ends. Prints one ready line:
    ``bmc-sim listening on <address>:<udp port> control <control_address>:<tcp port>``.
    ``address`` / ``control_address``: where IPMI (UDP) / the control API (TCP) listen.
    ``preload_alarms`` > 0 starts with that many alarms (for the overhead bench). Raises ``OSError``
    when a port cannot be bound.
    """
    state = SimState()
    if serial:
        state.serial = state.initial_serial = serial
    if preload_alarms > 0:
        state.add_alarms("08000001", 0x08, 0, 2, preload_alarms)
    if threading.current_thread() is threading.main_thread():  # SIGTERM: a clean exit 0, as the daemons
        # installed before the ready line: a SIGTERM right after it must not find the default action

        def _term(signum, frame):
            raise SystemExit(0)

        signal.signal(signal.SIGTERM, _term)
    sim_bmc, ipmisession = _patched_classes()
    bmc = sim_bmc({user: password}, state, port=port, address=address)
    httpd = ThreadingHTTPServer((control_address, control_port), make_control_handler(state))
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, name="bmc-sim-control", daemon=True).start()
    try:  # from the ready line on, a SIGTERM ends in the clean stop below
        ready_out.write(
            f"bmc-sim listening on {address}:{bmc.port} control {control_address}:{httpd.server_address[1]}\n"
        )
        ready_out.flush()
        event(log, logging.INFO, "bmc-sim started", port=bmc.port, control=httpd.server_address[1], user=user)
        while True:  # fix (2): an exception in pyghmi's loop must not end the simulator
            try:
                # A short wait: pyghmi's _io_wait can miss the wake-up for a packet grabbed just
                # before it queues its waiter, and then sleeps until its retry timer (~0.5-1 s).
                ipmisession.Session.wait_for_rsp(LOOP_WAIT_S)
            except Exception as e:
                event(log, logging.WARNING, "bmc-sim loop error", error=repr(e))
    finally:
        httpd.shutdown()
        event(log, logging.INFO, "bmc-sim stopped", port=bmc.port)
