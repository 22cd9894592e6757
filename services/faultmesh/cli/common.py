"""Helpers shared by CLI commands: the ClusterD address flags, HTTP GET/POST, tables and JSON output."""

from __future__ import annotations

import argparse
import http.client
import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any


class CliError(Exception):
    """A user-facing CLI error; printed as ``error: <message>`` with exit status 1."""


def add_server_flags(p: argparse.ArgumentParser) -> None:
    """``--http`` (ClusterD HTTP address), ``--grpc`` (gRPC address), ``--token``, ``-o table|json``."""
    p.add_argument(
        "--http",
        default=os.environ.get("FAULTMESH_HTTP_ADDR", "127.0.0.1:8080"),
        help="ClusterD HTTP address (env FAULTMESH_HTTP_ADDR)",
    )
    p.add_argument(
        "--grpc",
        default=os.environ.get("FAULTMESH_GRPC_ADDR", "127.0.0.1:8899"),
        help="ClusterD gRPC address (env FAULTMESH_GRPC_ADDR)",
    )
    p.add_argument(
        "--token-file",
        default=os.environ.get("FAULTMESH_TOKEN_FILE"),
        help="bearer token file for mutating calls (env FAULTMESH_TOKEN_FILE)",
    )
    p.add_argument("-o", "--output", choices=("table", "json"), default="table")


def token(args: argparse.Namespace) -> str | None:
    """The bearer token from ``--token-file`` or env ``FAULTMESH_TOKEN``. Raises :class:`CliError`."""
    if getattr(args, "token_file", None):
        try:
            with open(args.token_file, encoding="utf-8") as f:
                return f.read().strip()
        except OSError as e:
            raise CliError(f"cannot read token file {args.token_file}: {e.strerror or e}") from None
    return os.environ.get("FAULTMESH_TOKEN")


def base_url(addr: str) -> str:
    """``127.0.0.1:8080`` or ``http://127.0.0.1:8080/`` -> ``http://127.0.0.1:8080``."""
    addr = addr.strip().rstrip("/")
    return addr if addr.startswith(("http://", "https://")) else f"http://{addr}"


def http_json(
    args: argparse.Namespace, method: str, path: str, body: Any = None, timeout_s: float = 10.0
) -> Any:
    """Call ClusterD's HTTP API and return the decoded JSON. Raises :class:`CliError` with the reason."""
    url = base_url(args.http) + path
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    tok = token(args)
    if tok:
        req.add_header("Authorization", f"Bearer {tok}")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as e:
        detail = e.read().decode(errors="replace").strip()
        raise CliError(f"{method} {path}: HTTP {e.code}: {detail}") from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
        raise CliError(f"cannot reach clusterd's HTTP API at {args.http}: {e!r}") from None
    except ValueError:
        raise CliError(
            f"{args.http} answered {path} with something that is not JSON: is it clusterd's HTTP port?"
        ) from None


def print_table(rows: Sequence[Sequence[Any]], headers: Sequence[str], out=None) -> None:
    """Print rows as an aligned text table to ``out`` (default: the current ``sys.stdout``)."""
    out = out if out is not None else sys.stdout
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for r in cells:
        out.write("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() + "\n")


def emit(args: argparse.Namespace, data: Any, rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> None:
    """Print ``data`` as JSON with ``-o json``, else ``rows`` as a table."""
    if args.output == "json":
        sys.stdout.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
    else:
        print_table(rows, headers)


def run(fn):
    """Decorator for command functions: a :class:`CliError` prints ``error: ...`` and returns 1."""

    def wrapper(args: argparse.Namespace) -> int:
        try:
            return int(fn(args) or 0)
        except CliError as e:
            sys.stderr.write(f"error: {e}\n")
            return 1

    wrapper.__name__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    return wrapper
