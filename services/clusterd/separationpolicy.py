"""The manual-separation policy's document and the software-fault test (reference clusterd.md §6.2,
§8 ``manually_separate_policy.conf``), apart from :mod:`clusterd.separation`, which applies them."""

from __future__ import annotations

import bisect
import collections
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

MAX_POLICY_BYTES = 64 * 1024


class PolicyError(ValueError):
    """A policy file that is rejected (the message names the file, the key and why)."""


def _int_in(obj: dict, key: str, lo: int, hi: int, name: str, where: str, extra: tuple[int, ...] = ()) -> int:
    v = obj.get(key)
    if isinstance(v, bool) or not isinstance(v, int):
        raise PolicyError(f"{name}: {where}.{key}: {v!r} is not an integer")
    if not (lo <= v <= hi or v in extra):
        allowed = f"{lo}..{hi}" + "".join(f" or {e}" for e in extra)
        raise PolicyError(f"{name}: {where}.{key}: {v} outside {allowed}")
    return v


@dataclass(frozen=True)
class Policy:
    """The manual-separation policy (module docstring); defaults are the reference's shipped ones."""

    enabled: bool = True
    window_hours: int = 24
    threshold: int = 3
    free_hours: int = 48

    @classmethod
    def from_obj(cls, obj: Any, name: str = "manually_separate_policy.conf") -> Policy:
        """Validate a parsed YAML document. Raises :class:`PolicyError` naming the key and why."""
        if not isinstance(obj, dict):
            raise PolicyError(f"{name}: top level must be a mapping")
        enabled = obj.get("enabled", True)
        if not isinstance(enabled, bool):
            raise PolicyError(f"{name}: enabled: {enabled!r} is not true/false")
        sep, rel = obj.get("separate", {}), obj.get("release", {})
        for key, v in (("separate", sep), ("release", rel)):
            if not isinstance(v, dict):
                raise PolicyError(f"{name}: {key}: must be a mapping")
        d = cls()
        return cls(
            enabled,
            _int_in(
                {"fault_window_hours": d.window_hours, **sep}, "fault_window_hours", 1, 720, name, "separate"
            ),
            _int_in({"fault_threshold": d.threshold, **sep}, "fault_threshold", 1, 50, name, "separate"),
            _int_in(
                {"fault_free_hours": d.free_hours, **rel}, "fault_free_hours", 1, 240, name, "release", (-1,)
            ),
        )

    @classmethod
    def load(cls, path: str | Path) -> Policy:
        """Read and validate a policy file (at most 64 KiB). Raises :class:`PolicyError`."""
        p = Path(path)
        try:
            if p.stat().st_size > MAX_POLICY_BYTES:
                raise PolicyError(f"{p}: larger than {MAX_POLICY_BYTES} bytes")
            obj = yaml.safe_load(p.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
            raise PolicyError(f"{p}: cannot read: {e}") from None
        return cls.from_obj(obj, str(p))


def on_another_npu(seen: list[tuple], faults: list[tuple], window_ms: int) -> list[bool]:
    """For each of ``faults`` (``(t_ms, node, device, code, ...)``): did ``seen`` (same shape) hold
    the same code on another (node, device) within ``window_ms`` of it (the software-fault test of
    the module docstring)? O((n + k) log n) for n seen and k faults: per code, the times sorted and,
    for each position, where the next other device starts (a burst of 20k faults took a scan of
    every pair, ~20 s with the event loop blocked; tryout finding)."""
    by_code: dict[str, list[tuple[int, tuple[str, int]]]] = collections.defaultdict(list)
    for e in seen:
        by_code[e[3]].append((e[0], (e[1], e[2])))
    index: dict[str, tuple[list[int], list[tuple[str, int]], list[int]]] = {}
    for code, rows in by_code.items():
        rows.sort()
        times = [t for t, _ in rows]
        devs = [d for _, d in rows]
        nxt = [len(rows)] * len(rows)  # nxt[i]: first j > i whose device differs from devs[i]
        for i in range(len(rows) - 2, -1, -1):
            nxt[i] = i + 1 if devs[i + 1] != devs[i] else nxt[i + 1]
        index[code] = (times, devs, nxt)
    out = []
    for t, node, dev, code, *_ in faults:
        times, devs, nxt = index.get(code, ([], [], []))
        lo = bisect.bisect_left(times, t - window_ms)
        hi = bisect.bisect_right(times, t + window_ms)
        out.append(lo < hi and (devs[lo] != (node, dev) or nxt[lo] < hi))
    return out
