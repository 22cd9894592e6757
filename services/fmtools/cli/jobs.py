"""``faultmesh jobs`` and ``faultmesh job apply|get|delete|recovery|reset``: ClusterD's job registry.

``faultmesh jobs reset JOB [--reevaluate]`` (also ``faultmesh job reset``) is the operator undo of
the recovery brain: ``POST /v1/jobs/<id>/recovery/reset`` with the bearer token (``--token-file`` or
``FAULTMESH_TOKEN``) as every mutating command; exit 4 for a job that is unknown or has no Recover
client, 5 when the token is missing or wrong.

``faultmesh job apply -f job.yaml`` (or ``-f -`` for stdin; JSON or YAML, one job, a list or
several YAML documents; the format is in :mod:`clusterd.brain.jobs`) validates the file locally,
then POSTs it to ``/v1/jobs``.
"""

from __future__ import annotations

import argparse
import sys
import time

from fmtools.cli.common import (
    UsageError,
    add_server_flags,
    emit,
    http_json,
    print_table,
    read_text,
    run,
    structured,
)


def _ts(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000)) if ms else ""


@run
def cmd_jobs(args: argparse.Namespace) -> int:
    """Print every job (GET /v1/jobs)."""
    data = http_json(args, "GET", "/v1/jobs")
    rows = [
        (
            j["namespace"],
            j["name"],
            j["id"],
            j["status"],
            len(j["ranks"]),
            len({r["node"] for r in j["ranks"]}),
            j["health"],
            j["fault_count"],
            ",".join(j["strategies"]),
            j["subHealthyStrategy"] or "-",
            j["state"] or ("-" if not j["registered"] else ""),
        )
        for j in data
    ]
    emit(
        args,
        data,
        rows,
        (
            "NAMESPACE",
            "NAME",
            "ID",
            "STATUS",
            "RANKS",
            "NODES",
            "HEALTH",
            "FAULTS",
            "STRATEGIES",
            "SUBHEALTH",
            "STATE",
        ),
    )
    return 0


@run
def cmd_apply(args: argparse.Namespace) -> int:
    """Validate and apply a job file (POST /v1/jobs)."""
    from faultmesh.jobspec import JobSpecError, parse_jobs_text

    text = read_text(args.file, "job file")
    try:
        jobs = parse_jobs_text(text)
    except JobSpecError as e:
        raise UsageError(f"{args.file}: {e}") from None
    body = [j.to_dict() for j in jobs]
    data = http_json(args, "POST", "/v1/jobs", body)
    emit(
        args,
        data,
        [(d["namespace"], d["name"], d["id"], d["result"]) for d in data],
        ("NAMESPACE", "NAME", "ID", "RESULT"),
    )
    return 0


def _job(args: argparse.Namespace) -> str:
    job = args.job_flag or args.id
    if not job:
        jobs_cmd, job_cmd = getattr(args, "jobs_command", None), getattr(args, "job_command", None)
        cmd = f"jobs {jobs_cmd}" if jobs_cmd else f"job {job_cmd or 'ACTION'}"
        raise UsageError(f"name the job: faultmesh {cmd} JOB (or --job JOB)")
    return job


@run
def cmd_get(args: argparse.Namespace) -> int:
    """Print one job: ranks with their faults (GET /v1/jobs/<id>)."""
    j = http_json(args, "GET", f"/v1/jobs/{_job(args)}")
    if structured(args):
        emit(args, j, [], ())
        return 0
    print_table(
        [
            (
                j["namespace"],
                j["name"],
                j["id"],
                j["status"],
                j["health"],
                j["state"] or "-",
                ",".join(j["strategies"]),
            )
        ],
        ("NAMESPACE", "NAME", "ID", "STATUS", "HEALTH", "STATE", "STRATEGIES"),
    )
    faults: dict[int, list[str]] = {}
    for f in j["faults"]:
        faults.setdefault(f["rank"], []).append(f"{f['code'] or '-'}:{f['level']}")
    sys.stdout.write("\n")
    print_table(
        [(r["rank"], r["node"], r["device"], " ".join(faults.get(r["rank"], [])) or "-") for r in j["ranks"]],
        ("RANK", "NODE", "DEVICE", "FAULTS"),
    )
    return 0


@run
def cmd_delete(args: argparse.Namespace) -> int:
    """Delete a job (DELETE /v1/jobs/<id>)."""
    data = http_json(args, "DELETE", f"/v1/jobs/{_job(args)}")
    emit(args, data, [(data["id"], data["result"])], ("ID", "RESULT"))
    return 0


@run
def cmd_recovery(args: argparse.Namespace) -> int:
    """Print the recovery state and decisions of a job (GET /v1/jobs/<id>/recovery)."""
    data = http_json(args, "GET", f"/v1/jobs/{_job(args)}/recovery")
    rows = [
        (
            _ts(d["time_ms"]),
            d["flow"],
            d["decision"],
            ",".join(str(f["rank"]) for f in d.get("faults", [])) or "-",
            d["reason"],
        )
        for d in data["decisions"]
    ]
    if not structured(args):
        sys.stdout.write(
            f"job {data['job_id']}  state {data['state'] or '-'}  registered {data['registered']}  "
            f"subscribed {data['subscribed']}\n"
        )
    emit(args, data, rows, ("TIME", "FLOW", "DECISION", "RANKS", "REASON"))
    return 0


@run
def cmd_reset(args: argparse.Namespace) -> int:
    """Clear a job's recovery state (POST /v1/jobs/<id>/recovery/reset): the running flow is
    cancelled, the cached faults dropped, a paused process-recover-enable set back to ``on``; with
    ``--reevaluate`` the job's current faults act again as new."""
    body = {"reevaluate": True} if args.reevaluate else {}
    data = http_json(args, "POST", f"/v1/jobs/{_job(args)}/recovery/reset", body)
    emit(
        args,
        data,
        [(data["job_id"], data["result"], data["was"] or "-", data["state"] or "-")],
        ("ID", "RESULT", "WAS", "STATE"),
    )
    return 0


def _add_reset(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("reset", help="operator undo: clear a job's recovery state (needs the token)")
    add_server_flags(p)
    p.add_argument("id", nargs="?", help="job id (UID); or --job")
    p.add_argument("--job", dest="job_flag", metavar="JOB", help="job id (UID)")
    p.add_argument(
        "--reevaluate", action="store_true", help="let the job's current faults act again as new ones"
    )
    p.set_defaults(func=cmd_reset)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("jobs", help="list training jobs with health and recovery state; jobs reset JOB")
    add_server_flags(p)
    p.set_defaults(func=cmd_jobs)
    _add_reset(p.add_subparsers(dest="jobs_command", metavar="ACTION"))
    job = sub.add_parser("job", help="apply, show or delete training jobs")
    jsub = job.add_subparsers(dest="job_command", metavar="ACTION")
    jsub.required = True
    p = jsub.add_parser("apply", help="create or update jobs from a JSON/YAML file")
    add_server_flags(p)
    p.add_argument("-f", "--file", required=True, help="job file (JSON or YAML), - for stdin")
    p.set_defaults(func=cmd_apply)
    for name, fn, text in (
        ("get", cmd_get, "show one job with its rank faults"),
        ("delete", cmd_delete, "delete a job"),
        ("recovery", cmd_recovery, "show a job's recovery state and decisions"),
    ):
        p = jsub.add_parser(name, help=text)
        add_server_flags(p)
        p.add_argument("id", nargs="?", help="job id (UID); or --job")
        p.add_argument("--job", dest="job_flag", metavar="JOB", help="job id (UID)")
        p.set_defaults(func=fn)
    _add_reset(jsub)
