"""A blocking, thread-safe wrapper around pyghmi's IPMI 2.0 (lanplus) client.

Every method blocks; callers on the event loop run them through
:class:`faultmesh.runtime.BlockingPool` with a timeout. Source: reference ecosystem.md §2.1/§2.4.

pyghmi facts this wrapper handles (ecosystem.md §2.4):

- credentials must be ``bytes`` (with ``str`` a second login to the same BMC hangs or raises);
- a dead BMC at login raises ``IpmiException`` after ~4.5 s; a BMC that dies under an open session
  makes the next call block ~28 s, so callers must time out and must not queue more calls behind a
  hung one: :class:`BmcClient` holds a lock and a second caller gets :class:`BmcBusy` at once;
- after any transport error the ``Command`` is dropped, so the next call logs in again.

The password is held only as bytes in this object; it never appears in messages or ``repr``.
"""

from __future__ import annotations

import threading
from typing import NamedTuple

from noded.bmc import oem

# Completion codes (IPMI 2.0 table 5-2) that mean "this BMC does not do that command".
UNSUPPORTED_CODES = frozenset({0xC1, 0xC2, 0xC7, 0xC9, 0xCC, 0xCD, 0xD4, 0xD5, 0xD6})
# Of those, codes that say "not now" rather than "never" (0xD5: not supported in present state),
# plus the busy / timeout / cannot-answer codes: one of them is no reason to give up the command.
TRANSIENT_CODES = frozenset({0xC0, 0xC3, 0xCE, 0xD5})
CC_NOT_PRESENT = 0xCB
MAX_SERIAL_LEN = 128  # what ClusterD accepts as Hello.node_sn
HUAWEI_MANUFACTURER_ID = 2011


IO_WAIT_SLICE_S = 0.02
_fix_lock = threading.Lock()
_fix_installed = False


def install_pyghmi_wakeup_fix(slice_s: float = IO_WAIT_SLICE_S) -> None:
    """Bound a missed wake-up in pyghmi 1.6.19's client to ``slice_s`` (idempotent, process-wide).

    ``Session.awaitresponse`` checks the session's packet queue and then waits in ``_io_wait`` for
    the I/O thread to signal a packet from the BMC. A reply that the I/O thread grabs between the
    two is never signalled, so the caller sleeps until its retry timer (0.5-1.5 s) although the
    reply is there. Measured against bmc-sim: about once per 0.7 s of back-to-back requests, i.e.
    most 15-page OEM polls stall ~0.9 s. Every caller of ``_io_wait`` re-checks its condition in a
    loop, so waiting in slices of ``slice_s`` keeps the semantics and bounds the stall.
    """
    global _fix_installed
    with _fix_lock:
        if _fix_installed:
            return
        import pyghmi.ipmi.private.session as psession

        orig = psession._io_wait

        def _io_wait(timeout, myaddr=None, evq=None):
            return orig(slice_s if timeout is None else min(timeout, slice_s), myaddr, evq)

        psession._io_wait = _io_wait
        _fix_installed = True


class BmcError(Exception):
    """Base of BMC access errors. ``kind`` is a stable word for metrics and logs."""

    kind = "error"


class BmcUnreachable(BmcError):
    """No answer, login failed for a transport reason, or the session broke."""

    kind = "unreachable"


class BmcAuthError(BmcError):
    """The BMC rejected the user name or password."""

    kind = "auth"


class BmcBusy(BmcError):
    """A previous call to this BMC is still running (it timed out on the caller's side)."""

    kind = "busy"


class BmcCommandError(BmcError):
    """The BMC answered with a non-zero completion code ``code`` for ``netfn``/``cmd``."""

    kind = "completion-code"

    def __init__(self, netfn: int, cmd: int, code: int, text: str = "") -> None:
        super().__init__(f"netfn 0x{netfn:02x} cmd 0x{cmd:02x}: completion code 0x{code:02x} {text}".rstrip())
        self.netfn = netfn
        self.cmd = cmd
        self.code = code

    @property
    def unsupported(self) -> bool:
        """True when the code means the command or its data is not supported by this BMC."""
        return self.code in UNSUPPORTED_CODES

    @property
    def transient(self) -> bool:
        """True when the code means "not now" (busy, timeout, not in present state): retry later."""
        return self.code in TRANSIENT_CODES


class DeviceId(NamedTuple):
    """Get Device ID answer: manufacturer (IANA) id, product id, firmware "major.minor", device id."""

    device_id: int
    manufacturer_id: int
    product_id: int
    firmware: str


class BmcClient:
    """One BMC at ``host``:``port`` (UDP, lanplus) with ``user``/``password``.

    ``timeout_s`` is kept for callers' bookkeeping; a call's real bound is the BlockingPool timeout
    of the caller (pyghmi gives up on its own after a few retries, ~4-30 s). Methods raise :class:`BmcError`
    subclasses; they are safe to call from any thread but run one at a time.
    """

    def __init__(self, host: str, port: int, user: str, password: str, timeout_s: float = 5.0) -> None:
        self.host = host
        self.port = port
        self._user = user.encode()
        self._password = password.encode()
        self.timeout_s = timeout_s
        self._cmd = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"BmcClient({self.host}:{self.port}, user={self._user.decode(errors='replace')!r})"

    # -- session -----------------------------------------------------------------------------
    def _command(self):
        if self._cmd is None:
            install_pyghmi_wakeup_fix()
            try:
                self._cmd = self._login()
            except (BmcError, OSError):
                raise
            except Exception:
                # pyghmi 1.6.19 sometimes fails a login with an internal error (seen: AttributeError
                # "'Session' object has no attribute 'errormsg'" for a wrong password); one retry
                # gives the real outcome
                try:
                    self._cmd = self._login()
                except (BmcError, OSError):
                    raise
                except Exception as e:
                    raise BmcUnreachable(f"login to {self.host}:{self.port} failed: {e!r}") from None
        return self._cmd

    def _login(self):
        import pyghmi.exceptions as pexc
        import pyghmi.ipmi.private.session as psession

        try:  # the session pyghmi.ipmi.command.Command(bmc=...) opens, without Command: importing it
            # loads pyghmi's OEM handlers and SDR/FRU/SEL code (~6 MiB resident) that only raw() needs
            return psession.Session(
                bmc=self.host,
                userid=self._user,
                password=self._password,
                port=self.port,
                kg=None,
                privlevel=None,
            )
        except pexc.IpmiException as e:
            text = (
                str(e) if e.args and e.args[0] not in (None, "") else ""
            )  # pyghmi raises (None) on a timeout
            if "password" in text.lower() or "unauthorized" in text.lower():
                raise BmcAuthError(f"login to {self.host}:{self.port} rejected: {text}") from None
            raise BmcUnreachable(f"login to {self.host}:{self.port} failed: {text or 'no answer'}") from None
        except OSError as e:
            raise BmcUnreachable(f"login to {self.host}:{self.port} failed: {e}") from None

    def drop_session(self) -> None:
        """Forget the session (log out best-effort) so the next call logs in again."""
        cmd, self._cmd = self._cmd, None
        if cmd is not None:
            try:
                cmd.logout()
            except Exception:  # the session is already broken; nothing to do
                pass

    def close(self) -> None:
        """Log out (best-effort, without waiting for a call that still hangs)."""
        if self._lock.acquire(blocking=False):
            try:
                self.drop_session()
            finally:
                self._lock.release()

    @property
    def busy(self) -> bool:
        """True while a call runs (possibly one that timed out on the caller's side and still hangs)."""
        return self._lock.locked()

    def locked(self):
        """Context manager taking this BMC's lock without waiting. Raises :class:`BmcBusy`."""
        return _NoWaitLock(self._lock)

    # -- commands (call with the lock held, see ``locked``) -----------------------------------
    def raw(self, netfn: int, cmd: int, data: bytes = b"") -> bytes:
        """Send one request; returns the reply data without the completion code.

        Raises :class:`BmcCommandError` on a non-zero completion code, :class:`BmcUnreachable`
        when the session is broken or nothing answered, :class:`BmcAuthError` on a bad login.
        """
        import pyghmi.exceptions as pexc

        c = self._command()
        try:
            # pyghmi's own retry timer (~0.5-1 s, then +1 s per retry) paces the first retransmit;
            # its _io_wait can also miss a wake-up and sleep until that timer, so a longer first
            # timeout would only make those stalls longer. The poll's overall bound is the caller's.
            rsp = c.raw_command(  # the arguments Command.raw_command passes on to its session
                netfn=netfn, command=cmd, bridge_request=(), data=tuple(data), delay_xmit=None, retry=True,
                timeout=None, rslun=0,
            )  # fmt: skip
        except pexc.IpmiException as e:
            self.drop_session()
            raise BmcUnreachable(f"{self.host}:{self.port}: {e or 'no answer'}") from None
        except Exception as e:  # pyghmi internals (struct.error, TypeError, ...): the session is unusable
            self.drop_session()
            raise BmcUnreachable(f"{self.host}:{self.port}: {e!r}") from None
        if rsp is None:
            self.drop_session()
            raise BmcUnreachable(f"{self.host}:{self.port}: no answer")
        code = rsp.get("code") or 0
        if code:
            raise BmcCommandError(netfn, cmd, code, str(rsp.get("error", "")))
        if "error" in rsp:
            self.drop_session()
            raise BmcUnreachable(f"{self.host}:{self.port}: {rsp['error']}")
        return bytes(rsp.get("data", b""))

    def device_id(self) -> DeviceId:
        """Get Device ID (netfn 0x06 cmd 0x01). Raises :class:`BmcError`; short replies are unreachable-class."""
        d = self.raw(0x06, 0x01)
        if len(d) < 11:
            raise BmcCommandError(0x06, 0x01, 0xFF, f"short Get Device ID reply ({len(d)} bytes)")
        mfg = d[6] | d[7] << 8 | d[8] << 16
        prod = d[9] | d[10] << 8
        return DeviceId(d[0], mfg, prod, f"{d[2] & 0x7F}.{d[3]:02x}")

    def chassis_power_on(self) -> bool:
        """Get Chassis Status (netfn 0x00 cmd 0x01): True when system power is on."""
        d = self.raw(0x00, 0x01)
        if not d:
            raise BmcCommandError(0x00, 0x01, 0xFF, "empty chassis status")
        return bool(d[0] & 0x01)

    def serial_number(self) -> str:
        """The server's serial number from a Huawei iBMC (reference noded.md §1 "Node SN"): OEM
        ``30 90 05 00 03 04 00 FF``, or the manufacturer name ``... 03 00 00 FF`` when the first
        reply is empty. The value is the reply data after its first byte. Returns "" when neither
        gives one. Raises :class:`BmcError`; :class:`BmcCommandError` (code 0xFF) for a value that
        cannot be a serial number (over ``MAX_SERIAL_LEN`` chars or not printable ASCII): it would
        make ClusterD refuse the node's Hello."""
        for selector in (0x04, 0x00):
            d = self.raw(oem.NETFN, oem.CMD_GET_INFO, bytes((0x05, 0x00, 0x03, selector, 0x00, 0xFF)))
            if len(d) > 1:
                sn = bytes(d[1:]).decode("ascii", "replace").strip("\x00 \t\r\n")
                if len(sn) > MAX_SERIAL_LEN or not all(" " <= c <= "~" for c in sn):
                    raise BmcCommandError(
                        oem.NETFN, oem.CMD_GET_INFO, 0xFF, f"serial number of {len(sn)} chars rejected"
                    )
                return sn
        return ""

    def oem_alarms(self) -> list[oem.AlarmRecord]:
        """All current Huawei iBMC alarms, paged (see :func:`noded.bmc.oem.read_alarms`).

        Raises :class:`noded.bmc.oem.OemReplyError` for bad replies and :class:`BmcError`.
        """
        return oem.read_alarms(lambda req: self.raw(oem.NETFN, oem.CMD, req))


class _NoWaitLock:
    def __init__(self, lock: threading.Lock) -> None:
        self._lock = lock

    def __enter__(self) -> None:
        if not self._lock.acquire(blocking=False):
            raise BmcBusy("a previous BMC call is still running")

    def __exit__(self, *exc) -> None:
        self._lock.release()
