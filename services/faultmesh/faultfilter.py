"""A job's fault filter annotations (the reference's *custom* processor; clusterd.md §6.2 "custom").

Two job annotations silence faults on the devices a job uses for a while, so a self-healing
workload (a MindIE service, a job whose framework retries) is not rescheduled for a fault that
goes away by itself:

- ``huawei.com/schedule.filter.faultCode``: ``"8C1F8608:30, 80E01801"`` -- chip codes (faultCode.json)
  and UnifiedBus switch codes (SwitchFaultCode.json, ``[0x...,...]``: commas inside ``[]`` belong to
  the code), each with a window in s;
- ``huawei.com/schedule.filter.faultLevel``: ``"RestartRequest:30, RestartBusiness"`` -- NPU levels
  and switch levels (aliases: ResetFault / SeparateFault -> Separate, RestartRequestFault ->
  RestartRequest, PreSeparateFault -> PreSeparate).

Entries are separated by ``,`` (or the full-width ``，``); a window follows ``:`` (or ``：``). A window
left out, not an integer or outside 0..86400 s is 60 s, as in the reference. A fault is hidden until
it has lasted longer than its window (from its first-seen time); a code entry wins over a level
entry. :func:`parse_filter` returns the entries it kept and the problems it found (an unknown level,
a malformed code): the job spec (``faultmesh job apply``) refuses those, Kubernetes mode drops
them with a counted reason and keeps the rest.
"""

from __future__ import annotations

from faultmesh.faultrules import canonical_code
from faultmesh.levels import NpuLevel

CODE_KEY = "huawei.com/schedule.filter.faultCode"
LEVEL_KEY = "huawei.com/schedule.filter.faultLevel"
DEFAULT_WINDOW_S = 60
MAX_WINDOW_S = 86_400
SWITCH_LEVELS = ("NotHandle", "SubHealthFault", "RestartRequest", "PreSeparate", "Separate")
LEVEL_ALIASES = {
    "ResetFault": "Separate",
    "SeparateFault": "Separate",
    "RestartRequestFault": "RestartRequest",
    "PreSeparateFault": "PreSeparate",
}
LEVELS = frozenset(NpuLevel.__members__) | frozenset(SWITCH_LEVELS)


def split_entries(text: str) -> list[str]:
    """``text`` split at ``,`` / ``，`` outside ``[]``, each entry stripped, empty ones left out."""
    out, cur, depth = [], [], 0
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth = max(0, depth - 1)
        if ch in ",，" and depth == 0:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur).strip())
    return [e for e in out if e]


def _window(raw: str) -> int:
    raw = raw.strip()
    if raw.isdigit() and int(raw) <= MAX_WINDOW_S:
        return int(raw)
    return DEFAULT_WINDOW_S


def parse_filter(text: str, kind: str) -> tuple[dict[str, int], list[str]]:
    """One filter annotation: (key -> window s, problems). ``kind`` is ``"code"`` (keys are the
    canonical code spellings of :func:`faultmesh.faultrules.canonical_code`) or ``"level"`` (level
    names, aliases resolved). A key given twice keeps its last window."""
    kept: dict[str, int] = {}
    problems: list[str] = []
    for entry in split_entries(text or ""):
        tail = entry[entry.rfind("]") + 1 :] if entry.startswith("[") else entry
        cut = max(tail.rfind(":"), tail.rfind("："))
        key, window = (entry, DEFAULT_WINDOW_S)
        if cut >= 0:
            at = len(entry) - len(tail) + cut
            key, window = entry[:at].strip(), _window(entry[at + 1 :])
        if kind == "code":
            try:
                kept[canonical_code(key)] = window
            except ValueError:
                problems.append(f"fault code {key[:64]!r} is neither a chip nor a switch code")
        else:
            level = LEVEL_ALIASES.get(key, key)
            if level in LEVELS:
                kept[level] = window
            else:
                problems.append(f"fault level {key[:64]!r} is not an NPU or switch level")
    return kept, problems


def clean(text: str, kind: str) -> tuple[str, list[str]]:
    """``text`` with only the entries :func:`parse_filter` keeps (``key:window``, comma-separated),
    and the problems of the rest: what Kubernetes mode stores for a job."""
    kept, problems = parse_filter(text, kind)
    return ",".join(f"{k}:{w}" for k, w in kept.items()), problems
