"""Recovery strategy choice with the reference's fallback order (clusterd.md §7.3 "Strategy choice").

First choice, in priority order: retry -> recover-in-place -> recover -> elastic-training -> dump
-> exit, each only when configured on the job *and* reported by the training side (TaskD's
ReportRecoverStrategy) and its own condition holds. After a failure:

- retry failed: recover-in-place -> recover -> elastic-training -> dump -> exit;
- recover / recover-in-place / elastic-training failed: dump -> exit;
- dump failed (or anything else): exit.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

# Signal names: elastic-training is sent as "downgrade", recover-in-place as "recover" + extraParams.
SIGNAL_NAME = {
    "retry": "retry",
    "recover-in-place": "recover",
    "recover": "recover",
    "elastic-training": "downgrade",
    "dump": "dump",
    "exit": "exit",
}
ORDER = ("retry", "recover-in-place", "recover", "elastic-training", "dump", "exit")
AFTER_FAILURE = {
    "retry": ("recover-in-place", "recover", "elastic-training", "dump", "exit"),
    "recover-in-place": ("dump", "exit"),
    "recover": ("dump", "exit"),
    "elastic-training": ("dump", "exit"),
    "dump": ("exit",),
    "exit": ("exit",),
}
IN_PLACE_LEVELS = ("RestartRequest", "RestartBusiness", "NotHandleFault")


@dataclass(frozen=True, slots=True)
class Choice:
    """The chosen strategy (job-config name), its signal name, extraParams and the reason."""

    strategy: str
    signal: str
    extra: str
    reason: str


def choose(
    configured: Iterable[str],
    reported: Iterable[str],
    fault_types: Iterable[str],
    fault_levels: Iterable[str],
    pod0_faulty: bool,
    allowed: Iterable[str] = ORDER,
    in_place: bool | None = None,
    elastic_ok: bool = True,
) -> Choice:
    """Pick the strategy (see module docstring).

    ``configured``: the job's strategies; ``reported``: the training side's list (signal names:
    retry, recover, downgrade, dump, exit); ``fault_types``: FaultRank types ("0"/"2" retry, "1"
    normal); ``fault_levels``: the faults' levels; ``allowed``: what the fallback still permits;
    ``in_place``: whether some fault pod can restart its processes in place (the controller's
    15 s split, :mod:`clusterd.brain.inplace`); None: decided by the levels alone; ``elastic_ok``:
    False when the resources came back within the elastic resource wait (no scale-in).
    """
    conf = set(configured)
    rep = set(reported)
    types = list(fault_types)
    levels = list(fault_levels)
    allowed = set(allowed)
    normal = any(t == "1" for t in types)

    def ok(s: str) -> bool:
        return s in allowed and s in conf

    if ok("retry") and not normal:
        if "retry" in rep:
            return Choice("retry", "retry", "", "only step-retry faults and retry is configured and reported")
        allowed &= {"dump", "exit"}
        if ok("dump") and "dump" in rep:
            return Choice("dump", "dump", "", "retry not reported by the training side: faults become normal")
        return Choice("exit", "exit", "", "retry not reported by the training side and dump not possible")
    if in_place is None:
        in_place = bool(levels) and all(lv in IN_PLACE_LEVELS for lv in levels)
    if ok("recover-in-place") and "recover" in rep and in_place:
        return Choice(
            "recover-in-place", "recover", "recover-in-place", "only RestartRequest/RestartBusiness faults"
        )
    if ok("recover") and "recover" in rep:
        return Choice("recover", "recover", "", "recover is configured and reported")
    if ok("elastic-training") and "downgrade" in rep and elastic_ok:
        if pod0_faulty:
            pass
        else:
            return Choice(
                "elastic-training",
                "downgrade",
                '{"scale-in-strategy": "DP"}',
                "elastic-training configured and reported, pod rank 0 healthy",
            )
    if ok("dump") and "dump" in rep:
        return Choice("dump", "dump", "", "dump is configured and reported")
    why = []
    for s in ("retry", "recover-in-place", "recover", "elastic-training", "dump"):
        if s in conf and s not in allowed:
            why.append(f"{s} already failed or excluded")
        elif s in conf:
            why.append(f"{s} not possible")
    return Choice("exit", "exit", "", "; ".join(why) or "no other strategy configured")
