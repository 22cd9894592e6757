"""``faultmesh slownode enable|disable|status``: FD-OL slow-node detection of a job through ClusterD.

- ``enable --job J --conf featconf.json [--ranks '{"0": "node-a"}' | --ranks-file F]``: POST
  /v1/slownode/jobs with the FeatConf (reference fdol.md §7: a FeatConf object, or the ConfigMap
  payload ``{"FeatConf": "<json>"}``); ``jobName`` defaults to ``--job``; the rank placement may also
  sit in the conf file as ``ranks`` or come from ClusterD's job registry.
- ``disable --job J``: POST /v1/slownode/<J>/disable.
- ``status [JOB]``: every job (GET /v1/slownode) or one job's latest node and cluster results.
"""

from __future__ import annotations

import argparse
import json
import sys

from fmtools.cli.common import (
    UsageError,
    add_server_flags,
    emit,
    http_json,
    print_table,
    read_json,
    run,
    structured,
)
from fmtools.cli.suggest import did_you_mean


@run
def cmd_enable(args: argparse.Namespace) -> int:
    """Enable or update slow-node detection of a job."""
    body = read_json(args.conf, "FeatConf file") if args.conf else {}
    if not isinstance(body, dict):
        raise UsageError("the FeatConf file must hold a JSON object")
    fc = body
    for k, v in list(body.items()):
        if k.lower() == "featconf":
            try:
                fc = json.loads(v) if isinstance(v, str) else v
            except json.JSONDecodeError as e:
                raise UsageError(f"{args.conf}: FeatConf is not JSON: {e}") from None
            if "ranks" in body:
                fc = {**fc, "ranks": body["ranks"]}
    if not isinstance(fc, dict):
        raise UsageError("FeatConf must be a JSON object")
    if not any(k.lower() == "jobname" for k in fc):
        fc["jobName"] = args.job
    if args.namespace:
        fc["jobNamespace"] = args.namespace
    if not any(k.lower() == "slownode" for k in fc):
        fc["SlowNode"] = 1
    if args.ranks:
        try:
            fc["ranks"] = json.loads(args.ranks)
        except json.JSONDecodeError as e:
            raise UsageError(f"--ranks is not JSON: {e}") from None
    elif args.ranks_file:
        fc["ranks"] = read_json(args.ranks_file, "ranks file")
    _warn_unknown_keys(fc)
    data = http_json(args, "POST", "/v1/slownode/jobs", fc)
    emit(
        args,
        data,
        [(data.get("jobId"), data.get("enabled"), ",".join(data.get("nodes", [])))],
        ("JOB", "ENABLED", "NODES"),
    )
    return 0


def _named_job(args: argparse.Namespace, action: str) -> str:
    """The job of ``slownode ACTION JOB`` or ``--job JOB``; :class:`UsageError` (exit 2) without."""
    job = args.job or args.job_pos
    if not job:
        raise UsageError(f"name the job: faultmesh slownode {action} JOB (or --job JOB)")
    return job


@run
def cmd_disable(args: argparse.Namespace) -> int:
    """Stop slow-node detection of a job."""
    data = http_json(args, "POST", f"/v1/slownode/{_named_job(args, 'disable')}/disable", {})
    emit(args, data, [(data.get("jobId"), data.get("enabled"))], ("JOB", "ENABLED"))
    return 0


def _ranks(xs) -> str:
    return "[" + " ".join(str(x) for x in xs or []) + "]"


@run
def cmd_status(args: argparse.Namespace) -> int:
    """Show slow-node detection state of every job or of one job."""
    job = args.job or args.job_pos
    if not job:
        data = http_json(args, "GET", "/v1/slownode")
        rows = [
            (
                j["jobId"],
                j["namespace"],
                ",".join(j["nodes"]),
                j["rounds"],
                j["heavyProfiling"],
                j["degraded"],
                _ranks(j["slowRanks"]),
            )
            for j in data
        ]
        emit(args, data, rows, ("JOB", "NAMESPACE", "NODES", "ROUNDS", "HEAVY", "DEGRADED", "SLOW RANKS"))
        return 0
    d = http_json(args, "GET", f"/v1/slownode/{job}")
    if structured(args):
        emit(args, d, [], ())
        return 0
    c = d.get("cluster") or {}
    print_table(
        [
            ("job", f"{d['namespace']}/{d['jobName']} (id {d['jobId']})"),
            ("rounds", d["rounds"]),
            ("heavy profiling", f"{d['heavyProfiling']} {d.get('heavyReason', '')}".strip()),
            # issue 31: "degraded True" beside "cluster degradation 0.0%" read as a contradiction;
            # one is the confirmed state (kept until as many clean rounds as confirmed it), the
            # other the latest round alone
            ("degradation confirmed", _confirmed(d)),
            ("slow ranks", _ranks(d["slowRanks"])),
            ("latest round isSlow", c.get("isSlow", "")),
            ("latest round degradation", c.get("degradationLevel", "")),
            ("latest round slowCalculateRanks", _ranks(c.get("slowCalculateRanks"))),
            ("latest round suspectRanks", _ranks(c.get("suspectRanks"))),
        ],
        ("FIELD", "VALUE"),
    )
    bound = (d.get("featConf") or {}).get("seqBound")
    rows = [
        (
            node,
            r.get("isSlow"),
            _ranks(r.get("slowCalculateRanks")),
            ",".join(x for x in r.get("detectedBy") or () if x != "stepTime") or "-",
            _top_score(r),
            _top_seq(r, bound),
            _ranks(r.get("sharedHostGroups")) if r.get("sharedHostGroups") else "-",
            r.get("degradationLevel"),
            _ranks(r.get("suspectRanks")),
            r.get("lastStep"),
        )
        for node, r in sorted((d.get("nodeResults") or {}).items())
    ]
    print()
    print_table(
        rows,
        ("NODE", "SLOW", "SLOW RANKS", "RULES", "TOP SCORE", "SEQUENTIAL", "SHARED HOST", "STEP-TIME DEG",
         "SUSPECTS", "LAST STEP"),
    )  # fmt: skip
    return 0


def _top_score(r: dict) -> str:
    """The node's highest rank score of the peer rules (>= 1 flags; docs/slownode.md):
    ``rank 2 dpLag 1.90``, or ``-``."""
    best = max(
        ((v, rank, key) for key in ("gapExcess", "dpLag") for rank, v in (r.get(key) or {}).items()),
        default=None,
    )
    return f"rank {best[1]} {best[2]} {best[0]:.2f}" if best else "-"


def _top_seq(r: dict, bound) -> str:
    """The node's highest sequential statistic against ``seqBound``: ``rank 1 4.9/6``, or ``-``."""
    stat = r.get("seqStat") or {}
    if not stat:
        return "-"
    rank, v = max(stat.items(), key=lambda kv: kv[1])
    return f"rank {rank} {v:g}/{bound:g}" if isinstance(bound, int | float) else f"rank {rank} {v:g}"


def _warn_unknown_keys(fc: dict) -> None:
    """Say on stderr which keys of ``fc`` clusterd will ignore (a misspelt key is otherwise taken
    silently: clusterd only logs ``featconf unknown keys ignored``), with the closest known key.
    A FeatConf that does not parse is left to clusterd's refusal, which names the key."""
    from fdol.slownode.featconf import FeatConfError, known_keys, parse_featconf

    try:
        unknown = parse_featconf(fc).unknown_keys
    except FeatConfError:
        return
    for key in unknown:
        print(
            f"warning: FeatConf key {key!r} is not known and is ignored{did_you_mean(key, known_keys())}",
            file=sys.stderr,
        )


def _confirmed(d: dict) -> str:
    """``no``, or ``yes`` with what ends it: the tracker keeps a confirmed degradation until
    ``nConsecSlowRoundsToConfirm`` consecutive clean rounds (fdol.slownode.cluster, recovery
    hysteresis), so a clean latest round does not clear it."""
    if not d["degraded"]:
        return "no"
    n = (d.get("featConf") or {}).get("nConsecSlowRoundsToConfirm")
    return f"yes (until {n} consecutive clean rounds)" if n else "yes"


def register(sub) -> None:
    """Add ``slownode enable|disable|status``."""
    p = sub.add_parser("slownode", help="FD-OL slow-node detection of training jobs")
    s = p.add_subparsers(dest="slownode_cmd", metavar="ACTION")
    s.required = True
    e = s.add_parser("enable", help="enable or update detection of a job with its FeatConf")
    e.add_argument("--job", required=True, help="job name")
    e.add_argument("--job-id", dest="job", help=argparse.SUPPRESS)
    e.add_argument("--conf", help="FeatConf JSON file (or the ConfigMap payload)")
    e.add_argument("--namespace", help="job namespace (default: the FeatConf's, else default)")
    e.add_argument("--ranks", help='rank placement JSON, e.g. \'{"0": "node-a", "1": "node-b"}\'')
    e.add_argument("--ranks-file", help="rank placement JSON file")
    add_server_flags(e)
    e.set_defaults(func=cmd_enable)
    d = s.add_parser("disable", help="stop detection of a job")
    d.add_argument("job_pos", nargs="?", metavar="JOB", help="job name or id (or --job)")
    d.add_argument("--job", help="job name or id")
    add_server_flags(d)
    d.set_defaults(func=cmd_disable)
    st = s.add_parser(
        "status", help="detection state and latest results (how to read them: docs/slownode.md)"
    )
    st.add_argument(
        "job_pos", nargs="?", metavar="JOB", help="job name or id (all jobs when omitted); or --job"
    )
    st.add_argument("--job", help="job name or id")
    add_server_flags(st)
    st.set_defaults(func=cmd_status)
