"""``faultmesh explain CODE``: what a fault code means, its level in each shipped table, and the
frequency, duration and relation rules that apply (offline: reads faultmesh's own default tables
through :mod:`faultmesh.faultinfo`, no server needed).

Exit status: 0 known code, 1 unknown code (no shipped table lists it and faultmesh has no
description), 2 malformed code. ``--json`` prints the same facts as one JSON object.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys

from faultmesh import faultinfo
from fmtools.cli import explain_nvidia

EPILOG = """\
CODE is a chip/node/public fault code in hex (80E18008, 0x80e18008, 020001002) or a switch fault
code string ("[0x08520003,na,L2,na]"). The levels and rules shown are faultmesh's shipped
defaults; an operator's own tables (deviced --fault-code-file etc.) may differ.

exit status: 0 the code is known; 1 the code is unknown (it is still reported and counted when it
occurs: deviced gives an unlisted chip code a level from the event severity, noded NotHandleFault);
2 the code is malformed.

  faultmesh explain --typical    the reference's typical faults by plane and module
  faultmesh explain xid 79       an NVIDIA XID (deviced --backend nvml); also: nvml gpu-lost
"""

# The codes a table can list (issue 31: `explain 80E1800`, 7 digits, read as an unknown code):
# chip and node codes are 8 hex digits, public fault codes 9.
CODE_FORMAT = re.compile(r"^(?:0[xX])?[0-9A-Fa-f]{8}$|^[0-9A-Fa-f]{9}$")

UNKNOWN_NOTE = (
    "no shipped table lists this code. When it occurs it is still reported, marked unknown and "
    "counted: deviced gives an unlisted chip code SeparateNPU for event severity >= 2 (or unknown) "
    "and NotHandleFault otherwise, an unlisted network code PreSeparateNPU; noded reports an "
    "unlisted node code as NotHandleFault."
)


def _jsonable(ex: faultinfo.Explanation) -> dict:
    d = dataclasses.asdict(ex)
    d["known"] = ex.known
    d["handling_by_level"] = {
        lv.level: dict(zip(("en", "zh"), faultinfo.level_handling(lv.level), strict=True)) for lv in ex.levels
    }
    return d


def _print_text(ex: faultinfo.Explanation, out) -> None:
    w = out.write
    w(f"{ex.code}{'  (switch fault)' if ex.switch else ''}\n")
    m = ex.meaning
    if m is not None:
        w(f"  name:      {m.name}\n")
        w(f"  module:    {m.module}\n")
        w(f"  impact:    {m.impact}\n")
        w(f"  handling:  {m.handling}\n")
        if m.zh:
            zh = " / ".join(m.zh[k] for k in ("module", "name", "impact", "handling") if m.zh.get(k))
            w(f"  中文:      {zh}\n")
        if m.source:
            w(f"  source:    {m.source}\n")
    elif ex.levels:
        w("  meaning:   no description in faultmesh's knowledge base (handling follows the level)\n")
    if ex.levels:
        w("levels:\n")
        for lv in ex.levels:
            en, zh = faultinfo.level_handling(lv.level)
            keys = f" (listed in {', '.join(lv.keys)})" if lv.keys else ""
            w(f"  {lv.component:8} {lv.table}: {lv.level}{keys}\n")
            if en:
                w(f"           -> {en}{f' ({zh})' if zh else ''}\n")
    else:
        w(f"level:     unknown: {UNKNOWN_NOTE}\n")
    rules = []
    for r in ex.frequency:
        release = r.get("ReleaseTimeWindow")
        rel = f", released after {release} s without recurrence" if release else ", released by an operator"
        rules.append(
            f"frequency (faultCustomization.json): {r.get('Times')} times within {r.get('TimeWindow')} s "
            f"-> {r.get('FaultHandling')}{rel}"
        )
    for r in ex.duration:
        rules.append(
            f"duration (faultCustomization.json): lasting more than {r.get('FaultTimeout')} s "
            f"-> {r.get('FaultHandling')}, cleared after {r.get('RecoverTimeout')} s recovered"
        )
    if ex.timeout is not None:
        rules.append(
            f"relation window (faultDuration.json): kept {ex.timeout.timeout_s} s waiting for a trigger "
            f"({ex.timeout.fault_type})"
        )
    for r in ex.relations:
        role = "trigger" if r.trigger == ex.code else "relation fault"
        rules.append(
            f"relation (relationFaultCustomization.json, as {role}): {r.trigger} with "
            f"{' + '.join(r.relations)} -> {r.strategy}"
        )
    w("rules:\n" if rules else "rules:     none\n")
    for line in rules:
        w(f"  {line}\n")
    if ex.missing_tables:
        w(f"warning: shipped tables not found: {', '.join(ex.missing_tables)}\n")


def cmd_explain(args: argparse.Namespace) -> int:
    """Print the explanation of one code; exit 0 known, 1 unknown, 2 malformed."""
    if args.typical:
        rows = faultinfo.typical_faults()
        if args.json:
            print(json.dumps(rows, ensure_ascii=False, indent=2))
            return 0
        for r in rows:
            print(f"[{r['plane']}] {r['module']}: {r['fault']}")
            print(f"    impact: {r['impact']}; handling: {r['handling']}")
        return 0
    words = [w for w in (args.code, getattr(args, "arg", None)) if w]
    if explain_nvidia.wants(words):
        return explain_nvidia.cmd(words, args.json)
    if not args.code:
        sys.stderr.write("error: give a CODE (or --typical)\n")
        return 2
    if not args.code.strip().startswith("[") and not CODE_FORMAT.match(args.code.strip()):
        sys.stderr.write(
            f"error: CODE must be 8 hex digits (80E18008, 0x80E18008), a 9-digit public fault code "
            f"(020001002) or a switch code string ([0x08520003,na,L2,na]); got {args.code[:64]!r}\n"
        )
        return 2
    try:
        ex = faultinfo.explain(args.code)
    except ValueError as e:
        sys.stderr.write(
            f"error: {e}; expected hex like 80E18008 or a switch code like [0x08520003,na,L2,na]\n"
        )
        return 2
    if args.json:
        print(json.dumps(_jsonable(ex), ensure_ascii=False, indent=2))
    else:
        _print_text(ex, sys.stdout)
    return 0 if ex.known else 1


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``explain`` to the CLI."""
    p = sub.add_parser(
        "explain",
        help="what a fault code means, its levels and the rules that apply",
        description=__doc__.split("\n\n")[0],
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("code", nargs="?", metavar="CODE", help="fault code (hex, or a switch code string)")
    p.add_argument("arg", nargs="?", metavar="ARG", help="after 'xid' / 'nvml': the XID or NVML condition")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--typical", action="store_true", help="list the reference's typical faults")
    p.set_defaults(func=cmd_explain)
