"""deviced's fault tables in the reference's own formats, and the level lookups over them.

- :class:`FaultCodeTable` reads ``faultCode.json`` (reference deviced.md §3.2): buckets of hex codes ->
  NPU level; chip lookup with the unknown-code severity fallback; network lookup restricted to four
  buckets (§2).
- :class:`Customization` reads ``faultCustomization.json`` (§4): GraceTolerance, FaultFrequency and
  FaultDuration rules with the §4.1 validation (a bad rule is dropped, the rest applies).
- :class:`SwitchFaultTable` reads ``SwitchFaultCode.json`` (§7): ``[0xALARM,faultId,peer,na]`` strings.
- :func:`load_fault_duration` / :func:`load_relations` read ``faultDuration.json`` and
  ``relationFaultCustomization.json`` (reference clusterd.md §6.3) with the core parsers of
  :mod:`faultmesh.faultrules`.

Defaults written for faultmesh ship in ``deviced/data/``; operators point ``--fault-code-file`` etc. at
their own files. Errors: :class:`TableError` for a file that is not usable at all.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from faultmesh.faultrules import DurationTable, RelationTable, RuleTableError, unknown_key
from faultmesh.levels import NpuLevel
from faultmesh.log import event

log = logging.getLogger("deviced.tables")

# Network (parameter-plane) codes and A5 hyper-plane codes (reference §2).
LINK_DOWN = 0x81078603
UBOE_PORT_DOWN = 0x81078607
UBOE_SUBHEALTH = 0x110000002
UBOE_PRESEPARATE = 0x110001024
NETWORK_CODES = frozenset({LINK_DOWN, UBOE_PORT_DOWN, UBOE_SUBHEALTH, UBOE_PRESEPARATE})
HYPERPLANE_CODES = frozenset({0x81B18603, 0x020001002, 0x020000002})
CARD_DROP = 0x40F84E00
RESET_FINISHED = 0x8C2FA009
# faultmesh's synthetic network code for an abnormal gateway probe (design.md: the probe feeds the
# 20 s rule). Longer than 32 bits like the reference's own synthetic codes, so it never collides.
GATEWAY_PROBE = 0x181078603
NETWORK_CODES_ALL = NETWORK_CODES | {GATEWAY_PROBE}

# Bucket keys in lookup order (reference §3.2): the first bucket holding a code wins.
CHIP_BUCKETS: tuple[tuple[str, NpuLevel], ...] = (
    ("SeparateNPUCodes", NpuLevel.SeparateNPU),
    ("PreSeparateNPUCodes", NpuLevel.PreSeparateNPU),
    ("RestartNPUCodes", NpuLevel.RestartNPU),
    ("FreeRestartNPUCodes", NpuLevel.FreeRestartNPU),
    ("RestartBusinessCodes", NpuLevel.RestartBusiness),
    ("RestartRequestCodes", NpuLevel.RestartRequest),
    ("SubHealthFaultCodes", NpuLevel.SubHealthFault),
    ("NotHandleFaultCodes", NpuLevel.NotHandleFault),
)
NETWORK_KEYS: tuple[tuple[str, NpuLevel], ...] = (
    ("SeparateNPUNetworkCodes", NpuLevel.SeparateNPU),
    ("PreSeparateNPUNetworkCodes", NpuLevel.PreSeparateNPU),
    ("SubHealthFaultNetworkCodes", NpuLevel.SubHealthFault),
    ("NotHandleFaultNetworkCodes", NpuLevel.NotHandleFault),
)
NETWORK_ALLOWED = (
    NpuLevel.SeparateNPU,
    NpuLevel.PreSeparateNPU,
    NpuLevel.SubHealthFault,
    NpuLevel.NotHandleFault,
)

SEVERITY_MINOR = 1


class TableError(ValueError):
    """A table file that cannot be read or has the wrong shape (message names the file)."""


def parse_code(text: str | int) -> int:
    """``"80E18008"`` / ``"0x80e18008"`` / int -> int. Raises ``ValueError``."""
    if isinstance(text, int):
        return text
    s = text.strip().lower()
    if s.startswith("0x"):
        s = s[2:]
    if not s or not re.fullmatch(r"[0-9a-f]{1,16}", s):
        raise ValueError(f"not a hex fault code: {text!r}")
    return int(s, 16)


MAX_TABLE_BYTES = 4 * 1024 * 1024  # the reference's largest default table is ~30 KiB


def _read_json(path: str | Path | None, default_name: str) -> tuple[Any, str]:
    if path is None:
        ref = resources.files("deviced") / "data" / default_name
        return json.loads(ref.read_text(encoding="utf-8")), f"<default {default_name}>"
    try:
        size = Path(path).stat().st_size
        if size > MAX_TABLE_BYTES:
            raise TableError(f"{path}: {size} bytes, larger than {MAX_TABLE_BYTES}")
        return json.loads(Path(path).read_text(encoding="utf-8")), str(path)
    except (OSError, ValueError) as e:
        if isinstance(e, TableError):
            raise
        raise TableError(f"cannot read {path}: {e}") from e


def _check_keys(obj: dict, known: Iterable[str], name: str) -> None:
    """Refuse a table with a key outside ``known`` (:func:`faultmesh.faultrules.unknown_key`)."""
    if bad := unknown_key(obj, list(known), name):
        raise TableError(bad)


def _code_list(obj: dict, key: str, name: str) -> list[Any]:
    """``obj[key]`` as a list (absent or null: empty); its entries are checked by the caller (a bad
    entry is skipped with a warning). Raises :class:`TableError` when it is not a list."""
    vals = obj.get(key)
    if vals is None:
        return []
    if not isinstance(vals, list):
        raise TableError(f"{name}: {key}: must be a list of code strings, not {type(vals).__name__}")
    return vals


class FaultCodeTable:
    """``faultCode.json``: code -> NPU level. ``spelling(code)`` gives the first spelling seen."""

    def __init__(self, buckets: dict[NpuLevel, set[int]], network: dict[NpuLevel, set[int]], spellings):
        self.buckets = buckets
        self.network_buckets = network
        self._spellings: dict[int, str] = spellings
        self._level: dict[int, NpuLevel] = {}
        for _key, level in reversed(CHIP_BUCKETS):  # higher buckets overwrite lower ones
            for c in buckets.get(level, ()):
                self._level[c] = level

    @classmethod
    def from_obj(cls, obj: Any, name: str = "faultCode.json") -> FaultCodeTable:
        """Build from the parsed JSON object. Invalid codes are skipped with a warning."""
        if not isinstance(obj, dict):
            raise TableError(f"{name}: top level must be an object")
        _check_keys(obj, [k for k, _ in CHIP_BUCKETS + NETWORK_KEYS], name)
        spellings: dict[int, str] = {}

        def codes(key: str) -> set[int]:
            out: set[int] = set()
            for v in _code_list(obj, key, name):
                try:
                    if not isinstance(v, str):
                        raise ValueError(v)
                    c = parse_code(v)
                except ValueError:
                    event(log, logging.WARNING, "fault code skipped", table=name, key=key, value=v)
                    continue
                spellings.setdefault(c, str(v).upper().removeprefix("0X"))
                out.add(c)
            return out

        buckets = {level: codes(key) for key, level in CHIP_BUCKETS}
        network = {level: codes(key) for key, level in NETWORK_KEYS}
        seen: dict[int, NpuLevel] = {}
        for _key, level in CHIP_BUCKETS:  # precedence order: the first level holding a code wins
            for c in sorted(buckets[level]):
                if c in seen:  # the reference's own file has one (A2301001): kept, not refused
                    event(log, logging.WARNING, "fault code in several levels", table=name,
                          code=spellings.get(c, f"{c:08X}"), kept=seen[c].name, also=level.name)  # fmt: skip
                else:
                    seen[c] = level
        return cls(buckets, network, spellings)

    @classmethod
    def load(cls, path: str | Path | None = None) -> FaultCodeTable:
        """Load ``path`` (None = faultmesh's default table). Raises :class:`TableError`."""
        obj, name = _read_json(path, "faultCode.json")
        return cls.from_obj(obj, name)

    def __len__(self) -> int:
        return len(self._level)

    def spelling(self, code: int) -> str:
        """Upper-case hex as first spelled in the table (leading zeros kept), else ``%08X``."""
        return self._spellings.get(code) or f"{code:08X}"

    def known(self, code: int) -> bool:
        """True when ``code`` is in some bucket."""
        return code in self._level or any(code in s for s in self.network_buckets.values())

    def listed_level(self, code: int) -> NpuLevel | None:
        """The bucket level of ``code`` (highest bucket wins), or None when unlisted."""
        return self._level.get(code)

    @staticmethod
    def severity_level(severity: int | None) -> NpuLevel:
        """The fallback for unlisted codes (§3.2): unknown or above minor -> SeparateNPU, else NotHandle."""
        if severity is None or severity < 0 or severity > 3 or severity > SEVERITY_MINOR:
            return NpuLevel.SeparateNPU
        return NpuLevel.NotHandleFault

    def chip_code_level(self, code: int, severity: int | None = 0) -> tuple[NpuLevel, bool]:
        """(level, unknown) of one chip code: its bucket, else the severity fallback (unknown=True)."""
        lvl = self._level.get(code)
        if lvl is not None:
            return lvl, False
        return self.severity_level(severity), True

    def network_code_level(self, code: int) -> tuple[NpuLevel, bool]:
        """(level, unknown) of one network code (§2): explicit network keys first, then the four allowed
        buckets; restart buckets are forced to NotHandleFault; unlisted -> PreSeparateNPU."""
        for _key, level in NETWORK_KEYS:
            if code in self.network_buckets.get(level, ()):
                return level, False
        lvl = self._level.get(code)
        if lvl is None:
            return NpuLevel.PreSeparateNPU, True
        if lvl in NETWORK_ALLOWED:
            return lvl, False
        event(
            log, logging.WARNING, "network code level forced", code=self.spelling(code), fault_level=lvl.name
        )
        return NpuLevel.NotHandleFault, False


@dataclass(frozen=True)
class FrequencyRule:
    """One FaultFrequency rule: ``times`` occurrences within ``window_s`` -> ``level``; released after
    ``release_s`` recovered (None = never)."""

    codes: frozenset[int]
    window_s: int
    times: int
    level: NpuLevel
    release_s: int | None


@dataclass(frozen=True)
class DurationRule:
    """One FaultDuration rule: a fault lasting > ``fault_timeout_s`` -> ``level``; it clears after
    ``recover_timeout_s`` recovered."""

    codes: frozenset[int]
    fault_timeout_s: int
    recover_timeout_s: int
    level: NpuLevel


@dataclass
class GraceTolerance:
    """GraceTolerance seconds (reference §4.1 ranges and defaults)."""

    wait_process_read_cm_s: int = 30
    wait_device_reset_s: int = 150
    wait_self_healing_s: int = 15


_GRACE_RANGES = {
    "WaitProcessReadCMTime": ("wait_process_read_cm_s", 5, 90),
    "WaitDeviceResetTime": ("wait_device_reset_s", 60, 180),
    "WaitFaultSelfHealingTime": ("wait_self_healing_s", 1, 30),
}
MAX_RELEASE = 2**32


@dataclass
class Customization:
    """``faultCustomization.json``: frequency and duration rules by code (first valid rule per code wins)."""

    grace: GraceTolerance = field(default_factory=GraceTolerance)
    frequency: dict[int, FrequencyRule] = field(default_factory=dict)
    duration: dict[int, DurationRule] = field(default_factory=dict)
    rejected: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)  # GraceTolerance settings off the defaults

    @classmethod
    def load(cls, path: str | Path | None = None) -> Customization:
        """Load ``path`` (None = default). Raises :class:`TableError` when unreadable."""
        obj, name = _read_json(path, "faultCustomization.json")
        return cls.from_obj(obj, name)

    @classmethod
    def from_obj(cls, obj: Any, name: str = "faultCustomization.json") -> Customization:
        """Validate per §4.1: a bad rule is dropped (named in ``rejected``), the rest applies."""
        if not isinstance(obj, dict):
            raise TableError(f"{name}: top level must be an object")
        _check_keys(obj, ("GraceTolerance", "FaultFrequency", "FaultDuration"), name)
        for key, typ in (("GraceTolerance", dict), ("FaultFrequency", list), ("FaultDuration", list)):
            if obj.get(key) is not None and not isinstance(obj[key], typ):
                raise TableError(f"{name}: {key}: must be a {'list' if typ is list else 'object'}")
        out = cls()
        g = obj.get("GraceTolerance") or {}
        if isinstance(g, dict):
            for key, (attr, lo, hi) in _GRACE_RANGES.items():
                v = g.get(key)
                if isinstance(v, int) and lo <= v <= hi:
                    setattr(out.grace, attr, v)
                elif v is not None:
                    out._reject(name, f"GraceTolerance.{key}={v!r} outside {lo}..{hi}")
            defaults = GraceTolerance()  # settings other than the defaults (deviced.grace warns when unused)
            out.ignored = [
                f"GraceTolerance.{key}={getattr(out.grace, attr)}"
                for key, (attr, _lo, _hi) in _GRACE_RANGES.items()
                if getattr(out.grace, attr) != getattr(defaults, attr)
            ]
        for i, r in enumerate(obj.get("FaultFrequency") or []):
            rule = out._frequency(r, f"FaultFrequency[{i}]", name)
            if rule is not None:
                out._add(out.frequency, rule, f"FaultFrequency[{i}]", name)
        for i, r in enumerate(obj.get("FaultDuration") or []):
            rule = out._duration(r, f"FaultDuration[{i}]", name)
            if rule is not None:
                out._add(out.duration, rule, f"FaultDuration[{i}]", name)
        return out

    def _reject(self, name: str, why: str) -> None:
        self.rejected.append(why)
        event(log, logging.WARNING, "fault customization rule dropped", table=name, reason=why)

    def _codes(self, r: dict, where: str, name: str) -> frozenset[int] | None:
        ids = r.get("EventId")
        if not isinstance(ids, list) or not ids:
            self._reject(name, f"{where}: EventId must be a non-empty list")
            return None
        try:
            return frozenset(parse_code(str(x)) for x in ids)
        except ValueError as e:
            self._reject(name, f"{where}: {e}")
            return None

    def _frequency(self, r: Any, where: str, name: str) -> FrequencyRule | None:
        if not isinstance(r, dict):
            self._reject(name, f"{where}: not an object")
            return None
        codes = self._codes(r, where, name)
        window, times, handling = r.get("TimeWindow"), r.get("Times"), r.get("FaultHandling")
        release = r.get("ReleaseTimeWindow")
        if codes is None:
            return None
        if not (isinstance(window, int) and 60 <= window <= 864000):
            self._reject(name, f"{where}: TimeWindow {window!r} outside 60..864000")
            return None
        if not (isinstance(times, int) and 1 <= times <= 100):
            self._reject(name, f"{where}: Times {times!r} outside 1..100")
            return None
        try:
            level = NpuLevel.parse(str(handling))
        except ValueError:
            self._reject(name, f"{where}: FaultHandling {handling!r} unknown")
            return None
        if release in (None, 0):
            if level != NpuLevel.ManuallySeparateNPU:
                self._reject(name, f"{where}: {level.name} needs a ReleaseTimeWindow")
                return None
            rel = None
        elif isinstance(release, int) and 60 <= release <= MAX_RELEASE:
            rel = None if release == MAX_RELEASE else release
        else:
            self._reject(name, f"{where}: ReleaseTimeWindow {release!r} outside 60..2^32")
            return None
        return FrequencyRule(codes, window, times, level, rel)

    def _duration(self, r: Any, where: str, name: str) -> DurationRule | None:
        if not isinstance(r, dict):
            self._reject(name, f"{where}: not an object")
            return None
        codes = self._codes(r, where, name)
        ft, rt, handling = r.get("FaultTimeout"), r.get("RecoverTimeout"), r.get("FaultHandling")
        if codes is None:
            return None
        if not (isinstance(ft, int) and 0 <= ft <= 600):
            self._reject(name, f"{where}: FaultTimeout {ft!r} outside 0..600")
            return None
        if not (isinstance(rt, int) and 0 <= rt <= 86400):
            self._reject(name, f"{where}: RecoverTimeout {rt!r} outside 0..86400")
            return None
        try:
            level = NpuLevel.parse(str(handling))
        except ValueError:
            level = None
        if level is None or level == NpuLevel.ManuallySeparateNPU:
            self._reject(name, f"{where}: FaultHandling {handling!r} not allowed")
            return None
        return DurationRule(codes, ft, rt, level)

    def _add(self, into: dict, rule, where: str, name: str) -> None:
        for c in sorted(rule.codes):
            if c in into:
                event(
                    log, logging.WARNING, "duplicate rule skipped", table=name, where=where, code=f"{c:08X}"
                )
                continue
            into[c] = rule

    def duration_rule(self, code: int) -> DurationRule | None:
        """The duration rule of ``code``; the gateway-probe code uses link-down's rule unless it has one."""
        rule = self.duration.get(code)
        if rule is None and code == GATEWAY_PROBE:
            rule = self.duration.get(LINK_DOWN)
        return rule

    def frequency_rule(self, code: int) -> FrequencyRule | None:
        """The frequency rule of ``code`` (gateway probe: link-down's rule unless it has one)."""
        rule = self.frequency.get(code)
        if rule is None and code == GATEWAY_PROBE:
            rule = self.frequency.get(LINK_DOWN)
        return rule


# ---- switch (lingqu) -------------------------------------------------------------------------

SWITCH_LEVELS = ("NotHandle", "SubHealthFault", "RestartRequest", "PreSeparate", "Separate")
SWITCH_LEVEL_RANK = {name: i for i, name in enumerate(SWITCH_LEVELS)}
SWITCH_NODE_STATUS = {
    "NotHandle": "Healthy",
    "SubHealthFault": "SubHealthy",
    "RestartRequest": "UnHealthy",
    "PreSeparate": "PreSeparate",
    "Separate": "UnHealthy",
}
_SWITCH_KEYS = (
    ("NotHandleFaultCodes", "NotHandle"),
    ("SubHealthFaultCodes", "SubHealthFault"),
    ("RestartRequestFaultCodes", "RestartRequest"),
    ("PreSeparateFaultCodes", "PreSeparate"),
    ("ResetFaultCodes", "Separate"),  # merged into Separate (reference §7)
    ("SeparateFaultCodes", "Separate"),
)
_SWITCH_CODE_RE = re.compile(r"^\[0x[0-9a-f]{8},(?:\d+|na),(?:cpu|npu|L2|na),na\]$", re.IGNORECASE)
PEER_NAMES = {0: "cpu", 1: "npu", 2: "L2"}
NA_FAULT_ID = 0xFFFFFFFF


def switch_code(alarm_id: int, fault_id: int, peer_type: int) -> str:
    """``[0x<alarm %08x>,<faultId|na>,<peer>,na]`` (reference §7); peer cpu/npu/L2 for 0/1/2 else na."""
    fid = "na" if fault_id == NA_FAULT_ID else str(fault_id)
    return f"[0x{alarm_id:08x},{fid},{PEER_NAMES.get(peer_type, 'na')},na]"


def normalize_switch_code(s: str) -> str:
    """Canonical spelling: lower-case hex alarm id, ``L2`` upper-case, everything else lower-case."""
    parts = s.strip().strip("[]").split(",")
    alarm = parts[0].lower()
    peer = parts[2].lower()
    return f"[{alarm},{parts[1].lower()},{'L2' if peer == 'l2' else peer},{parts[3].lower()}]"


class SwitchFaultTable:
    """``SwitchFaultCode.json``: switch code string -> switch level (``SWITCH_LEVELS``)."""

    def __init__(self, levels: dict[str, str]) -> None:
        self.levels = levels

    @classmethod
    def load(cls, path: str | Path | None = None) -> SwitchFaultTable:
        """Load ``path`` (None = default). Raises :class:`TableError`."""
        obj, name = _read_json(path, "SwitchFaultCode.json")
        return cls.from_obj(obj, name)

    @classmethod
    def from_obj(cls, obj: Any, name: str = "SwitchFaultCode.json") -> SwitchFaultTable:
        """Invalid strings are skipped with a warning (§7); a higher level wins for duplicates."""
        if not isinstance(obj, dict):
            raise TableError(f"{name}: top level must be an object")
        _check_keys(obj, [k for k, _ in _SWITCH_KEYS], name)
        levels: dict[str, str] = {}
        for key, level in _SWITCH_KEYS:
            for s in _code_list(obj, key, name):
                if not isinstance(s, str) or len(s) > 50 or not _SWITCH_CODE_RE.match(s.strip()):
                    event(log, logging.WARNING, "switch fault code skipped", table=name, key=key, value=s)
                    continue
                code = normalize_switch_code(s)
                if SWITCH_LEVEL_RANK[level] >= SWITCH_LEVEL_RANK.get(levels.get(code, "NotHandle"), 0):
                    levels[code] = level
        return cls(levels)

    def level(self, code: str) -> str | None:
        """The switch level of ``code``, or None when unlisted (unlisted codes are not reported, §7)."""
        return self.levels.get(normalize_switch_code(code))


# ---- cross-fault rules (faultDuration.json, relationFaultCustomization.json) ------------------


def load_fault_duration(path: str | Path | None = None) -> DurationTable:
    """``faultDuration.json`` (None = faultmesh's default): per-code relation deadlines in seconds.
    Bad entries are dropped into ``rejected``. Raises :class:`TableError` for an unusable file."""
    obj, name = _read_json(path, "faultDuration.json")
    try:
        return DurationTable.from_obj(obj, name)
    except RuleTableError as e:
        raise TableError(str(e)) from e


def load_relations(path: str | Path | None = None) -> RelationTable:
    """``relationFaultCustomization.json`` (None = faultmesh's default): trigger + relation faults ->
    SubHealth / Separate. Bad rules are dropped into ``rejected``. Raises :class:`TableError`."""
    obj, name = _read_json(path, "relationFaultCustomization.json")
    try:
        return RelationTable.from_obj(obj, name)
    except RuleTableError as e:
        raise TableError(str(e)) from e
