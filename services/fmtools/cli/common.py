"""Helpers shared by CLI commands: the ClusterD address flags, HTTP calls, output and exit codes.

Output (``-o``): ``table`` (default; aligned columns through rich, no borders, so scripts can still
split rows on whitespace), ``wide`` (the table plus the extra columns a command marks wide),
``json`` and ``yaml`` (the API's data, unchanged).

Exit codes (:data:`EXIT_CODES`, shown in ``faultmesh --help``): 0 ok, 1 the operation failed,
2 bad usage, 3 clusterd (or a simulator) unreachable, 4 not found, 5 rejected by the server.
"""

from __future__ import annotations

import argparse
import http.client
import io
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from typing import Any

from faultmesh.config import MAX_BODY_BYTES

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_NOT_FOUND, EXIT_REJECTED = range(6)
EXIT_CODES = """exit codes:
  0  success
  1  the operation ran and failed (e.g. a stress test found a fault)
  2  bad usage (unknown flag, bad value: the allowed values are named)
  3  unreachable (clusterd or a simulator does not answer at the given address)
  4  not found (no such job, node, super pod)
  5  rejected by the server (invalid request, missing token, rate limited)"""
OUTPUTS = ("table", "wide", "json", "yaml")


class CliError(Exception):
    """A user-facing CLI error; printed as ``error: <message>``, exit status :attr:`exit_code`."""

    exit_code = EXIT_FAILED


class UsageError(CliError):
    """Bad input from the command line (exit 2)."""

    exit_code = EXIT_USAGE


class Unreachable(CliError):
    """The server did not answer (exit 3)."""

    exit_code = EXIT_UNREACHABLE


class NotFound(CliError):
    """The server has no such object (exit 4)."""

    exit_code = EXIT_NOT_FOUND


class Rejected(CliError):
    """The server refused the request (exit 5)."""

    exit_code = EXIT_REJECTED


# What a server's error text says, where its status code does not (the reference answers an
# unknown job with a code of its own or gRPC UNKNOWN, and the rate limit with UNKNOWN too): the one
# table that turns such text into an exit code. Matched case-insensitively as substrings.
NOT_FOUND_TEXT = (
    "not exist",  # recover O&M: "job:<id> not exist"; faultsvc: "jobId=<id> does not exist"
    "failed to found",  # datatrace: "failed to found configmap:[ns/data-trace-job]"
    "notify subscribe failed",  # datatrace Modify of a job clusterd does not know (the reference's)
    "one of jobName, pgName, ns is empty",  # recover Init of a job clusterd does not know
    "not found",
)
REJECTED_TEXT = ("qps exceeded", "rate limit")


def server_error(message: str, default: type[CliError] = CliError) -> CliError:
    """The :class:`CliError` for a server's refusal ``message``: :class:`NotFound` when the text says
    the job (or object) does not exist (:data:`NOT_FOUND_TEXT`), :class:`Rejected` when it names the
    rate limit (:data:`REJECTED_TEXT`), else ``default``."""
    low = message.lower()
    if any(t.lower() in low for t in NOT_FOUND_TEXT):
        return NotFound(message)
    if any(t in low for t in REJECTED_TEXT):
        return Rejected(message)
    return default(message)


def add_server_flags(p: argparse.ArgumentParser) -> None:
    """``--http`` (ClusterD HTTP address), ``--grpc`` (gRPC address), ``--token-file``,
    ``--grpc-tls-ca/-cert/-key`` (:func:`add_grpc_tls_flags`), ``-o``."""
    p.add_argument(
        "--http",
        type=host_port,
        default=os.environ.get("FAULTMESH_HTTP_ADDR") or "127.0.0.1:8080",  # empty: unset
        help="ClusterD HTTP address host:port (env FAULTMESH_HTTP_ADDR)",
    )
    p.add_argument(
        "--grpc",
        type=host_port,
        default=os.environ.get("FAULTMESH_GRPC_ADDR") or "127.0.0.1:8899",
        help="ClusterD gRPC address host:port (env FAULTMESH_GRPC_ADDR)",
    )
    p.add_argument(
        "--token-file",
        default=os.environ.get("FAULTMESH_TOKEN_FILE"),
        help="bearer token file for mutating calls (env FAULTMESH_TOKEN_FILE)",
    )
    add_grpc_tls_flags(p)
    add_output_flag(p)


def add_grpc_tls_flags(p: argparse.ArgumentParser) -> None:
    """TLS to ClusterD's gRPC port (its ``--tls-cert``; issue 29, between hosts): ``--grpc-tls-ca``
    (env FAULTMESH_GRPC_TLS_CA) turns TLS on; ``--grpc-tls-cert`` / ``--grpc-tls-key`` (env
    FAULTMESH_GRPC_TLS_CERT / _KEY) add a client certificate for a clusterd with ``--tls-ca``
    (mTLS); ``--grpc-tls-server-name`` checks the server's certificate against another name than
    the dialled host. Checked when a command dials (:func:`fmtools.cli._grpc.credentials`)."""
    for what, help_ in (
        ("ca", "PEM CA of ClusterD's gRPC certificate: TLS on (env FAULTMESH_GRPC_TLS_CA)"),
        ("cert", "PEM client certificate for mTLS, with --grpc-tls-key (env FAULTMESH_GRPC_TLS_CERT)"),
        ("key", "PEM key of --grpc-tls-cert (env FAULTMESH_GRPC_TLS_KEY)"),
        (
            "server-name",
            "check ClusterD's certificate against this name, not --grpc's host (e.g. the Service's "
            "name through kubectl port-forward; env FAULTMESH_GRPC_TLS_SERVER_NAME)",
        ),
    ):
        p.add_argument(
            f"--grpc-tls-{what}",
            default=os.environ.get(f"FAULTMESH_GRPC_TLS_{what.upper().replace('-', '_')}") or None,
            help=help_,
        )


def add_output_flag(p: argparse.ArgumentParser) -> None:
    """``-o/--output table|wide|json|yaml``."""
    p.add_argument("-o", "--output", choices=OUTPUTS, default="table", help="output format (default table)")


def add_job_flag(p: argparse.ArgumentParser, required: bool = True, help: str = "the job's id") -> None:
    """``--job JOB`` (dest ``job_id``), the one spelling of a job; ``--job-id`` stays a hidden alias.
    ``required`` is checked after parsing (so either spelling satisfies it)."""
    p.add_argument("--job", dest="job_id", metavar="JOB", help=help + (" (required)" if required else ""))
    p.add_argument("--job-id", dest="job_id", help=argparse.SUPPRESS)
    if required:
        p.set_defaults(_require_job=p)


def check_job(args: argparse.Namespace) -> None:
    """Exit 2 (argparse's usage error) when a command needs ``--job`` and got none."""
    p = getattr(args, "_require_job", None)
    if p is not None and not getattr(args, "job_id", None):
        p.error("the following arguments are required: --job")


def token(args: argparse.Namespace) -> str | None:
    """The bearer token from ``--token-file`` or env ``FAULTMESH_TOKEN``. Raises :class:`UsageError`."""
    if getattr(args, "token_file", None):
        tok = read_text(args.token_file, "token file", stdin=False).strip()
        if not tok:  # as the daemons (faultmesh.config.BadSecretFile): never "no token" by accident
            raise UsageError(f"token file {args.token_file} is empty")
        return tok
    return os.environ.get("FAULTMESH_TOKEN")


def read_text(path: str, what: str = "file", stdin: bool = True, max_bytes: int = MAX_BODY_BYTES) -> str:
    """The text of ``path`` (``-``: stdin when ``stdin``), UTF-8, at most ``max_bytes`` (default:
    the largest request body clusterd takes, 16 MiB). Raises :class:`UsageError` (exit 2) when the
    file is missing, unreadable, larger (checked before any parsing) or not UTF-8."""
    try:
        if path == "-" and stdin:
            raw = getattr(sys.stdin, "buffer", None)  # a text stream without one (a test's StringIO)
            data = raw.read(max_bytes + 1) if raw is not None else sys.stdin.read(max_bytes + 1).encode()
        else:
            with open(path, "rb") as f:
                data = f.read(max_bytes + 1)
    except OSError as e:
        raise UsageError(f"cannot read {what} {path}: {e.strerror or e}") from None
    if len(data) > max_bytes:
        raise UsageError(
            f"{what} {path} is larger than {max_bytes >> 20} MiB, the most clusterd takes in one request"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"{what} {path} is not UTF-8 text (byte {e.start})") from None


def read_json(path: str, what: str = "file") -> Any:
    """:func:`read_text` decoded as JSON. Raises :class:`UsageError` (exit 2), naming the line."""
    text = read_text(path, what)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(f"{what} {path} is not JSON: {e}") from None


def host_port(text: str) -> str:
    """argparse ``type`` of an address flag: ``text`` unchanged, or ``ArgumentTypeError`` (exit 2)
    for a bare port (``--http 8080`` was read as the host "8080" on port 80)."""
    if text.strip().isdigit():
        raise argparse.ArgumentTypeError(
            f"{text!r} is a port alone: give host:port (e.g. 127.0.0.1:{text.strip()})"
        )
    return text


def base_url(addr: str) -> str:
    """``127.0.0.1:8080`` or ``http://127.0.0.1:8080/`` -> ``http://127.0.0.1:8080``. Raises
    ``ValueError`` for an address without a host, a bare port, or a port that is not a number."""
    addr = addr.strip().rstrip("/")
    if addr.isdigit():
        raise ValueError(f"{addr} is a port alone: give host:port")
    url = addr if addr.startswith(("http://", "https://")) else f"http://{addr}"
    parts = urllib.parse.urlsplit(url)
    if not parts.hostname:
        raise ValueError("no host")
    if parts.port is None and parts.netloc.rsplit("]", 1)[-1].count(":"):  # "host:" with no port
        raise ValueError("no port after ':'")
    return url


MAX_DETAIL_CHARS = 300  # the most of a server's error text an error line shows


def printable(text: str, limit: int = MAX_DETAIL_CHARS) -> str:
    """``text`` for an error line: an HTML page becomes ``an HTML page``, text with control bytes
    (an HTTP/2 or binary answer) ``N bytes that are not text``, else the text stripped and cut to
    ``limit`` characters (``...`` marks the cut)."""
    t = text.strip()
    if t[:200].lower().lstrip().startswith(("<!doctype html", "<html", "<?xml", "<head", "<body")):
        return "an HTML page"
    if any(not (c.isprintable() or c in "\n\t\r") for c in t):
        return f"{len(text.encode(errors='replace'))} bytes that are not text"
    return t if len(t) <= limit else t[:limit] + "..."


def reason(e: BaseException) -> str:
    """A plain reason for a connection failure: ``Connection refused``, ``timed out``, never a repr;
    an answer that is not HTTP/1.x (e.g. a gRPC port's HTTP/2 bytes) says so."""
    r = getattr(e, "reason", e)
    if isinstance(r, OSError) and r.strerror:
        return r.strerror
    if isinstance(r, http.client.BadStatusLine):
        return "the answer is not HTTP/1.x (is it a gRPC port?)"
    return printable(str(r)) or type(r).__name__


def http_error(what: str, status: int, body: str) -> CliError:
    """The :class:`CliError` for an HTTP error answer: 404 -> :class:`NotFound`, other 4xx ->
    :class:`Rejected`, 5xx -> :class:`CliError`; the server's ``{"error": ...}`` text is the message
    (through :func:`printable`: an HTML page or binary bytes are named, not printed)."""
    try:
        detail = json.loads(body).get("error") or body
    except (ValueError, AttributeError):
        detail = body
    detail = printable(str(detail))
    if detail == "an HTML page":
        detail = "an HTML page, not a faultmesh answer: is the address right?"
    msg = f"{what}: HTTP {status}: {detail}"
    if status == 404:
        return NotFound(msg)
    if 400 <= status < 500:
        return Rejected(msg)
    return CliError(msg)


def request_json(
    addr: str,
    method: str,
    path: str,
    body: Any = None,
    tok: str | None = None,
    timeout_s: float = 10.0,
    server: str = "clusterd's HTTP API",
    what: str | None = None,
    empty: Any = None,
) -> Any:
    """``method`` ``path`` on the HTTP server at ``addr`` (``host:port`` or a URL) with ``body`` as
    JSON and ``tok`` as the bearer token; returns the decoded JSON answer (``empty`` for an empty
    one). ``server`` names it in errors, ``what`` prefixes an error answer (default ``METHOD
    PATH``). Raises :class:`Unreachable` (no connection, not HTTP/1.x, an answer that is not JSON:
    the address is not that server), :class:`NotFound`, :class:`Rejected` or :class:`CliError`
    (:func:`http_error`); :class:`UsageError` for an address that is not one."""
    data = None if body is None else json.dumps(body).encode()
    try:
        req = urllib.request.Request(base_url(addr) + path, data=data, method=method)
    except ValueError as e:  # "Invalid IPv6 URL", "unknown url type"
        raise UsageError(f"bad address {addr!r} of {server}: {e}") from None
    req.add_header("Content-Type", "application/json")
    if tok:
        req.add_header("Authorization", f"Bearer {tok}")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            raw = resp.read()
    except ValueError as e:  # a port that is not a number, ...
        raise UsageError(f"bad address {addr!r} of {server}: {e}") from None
    except urllib.error.HTTPError as e:
        raise http_error(what or f"{method} {path}", e.code, e.read().decode(errors="replace")) from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
        raise Unreachable(f"cannot reach {server} at {addr}: {reason(e)}") from None
    try:
        return json.loads(raw) if raw else empty
    except ValueError:
        raise Unreachable(
            f"{addr} answered {path} with something that is not JSON: is it {server}'s address?"
        ) from None


def http_json(
    args: argparse.Namespace, method: str, path: str, body: Any = None, timeout_s: float = 10.0
) -> Any:
    """Call ClusterD's HTTP API at ``args.http`` (:func:`request_json`, token from :func:`token`)
    and return the decoded JSON. Raises :class:`Unreachable`, :class:`NotFound`, :class:`Rejected`
    or :class:`CliError` with the reason."""
    return request_json(args.http, method, path, body, token(args), timeout_s)


PLAIN_TABLE_ROWS = 1000  # a terminal table beyond this many rows is laid out plainly (rich: ~2.5 ms a row)


def _plain_table(rows: Sequence[Sequence[Any]], headers: Sequence[str], out) -> None:
    """What :func:`print_table` prints off a terminal (columns as wide as their widest cell, two
    spaces between, no trailing blanks), laid out directly: 20,000 rows in well under a second."""
    from rich.cells import cell_len  # the display width rich uses (CJK names take two cells)

    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(cell_len(row[i]) for row in cells) for i in range(len(headers))]
    for row in cells:
        line = "  ".join(c + " " * (w - cell_len(c)) for c, w in zip(row, widths, strict=True))
        out.write(line.rstrip() + "\n")


def print_table(rows: Sequence[Sequence[Any]], headers: Sequence[str], out=None) -> None:
    """Print rows as an aligned table (rich, no borders, two spaces between columns) to ``out``
    (default: the current ``sys.stdout``). Off a terminal nothing wraps or is cut; there, and for a
    terminal table of more than :data:`PLAIN_TABLE_ROWS` rows, the layout is computed directly
    (:func:`_plain_table`, the same text)."""
    out = out if out is not None else sys.stdout
    tty = hasattr(out, "isatty") and out.isatty()
    if not tty or len(rows) > PLAIN_TABLE_ROWS:
        _plain_table(rows, headers, out)
        return
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    t = Table(
        box=None, show_edge=False, pad_edge=False, padding=(0, 2, 0, 0), header_style="bold" if tty else ""
    )
    for h in headers:
        t.add_column(str(h), no_wrap=not tty, overflow="fold")
    for r in rows:
        t.add_row(*(Text("" if c is None else str(c)) for c in r))
    buf = io.StringIO()
    Console(
        file=buf, width=None if tty else 100_000, force_terminal=tty, color_system="auto" if tty else None
    ).print(t)
    for line in buf.getvalue().splitlines():
        out.write(line.rstrip() + "\n")


def emit(
    args: argparse.Namespace,
    data: Any,
    rows: Sequence[Sequence[Any]],
    headers: Sequence[str],
    wide: int = 0,
) -> None:
    """Print ``data`` as JSON / YAML with ``-o json|yaml``, else ``rows`` as a table; the last
    ``wide`` columns only with ``-o wide``."""
    fmt = getattr(args, "output", "table")
    if fmt == "json":
        sys.stdout.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
    elif fmt == "yaml":
        import yaml

        sys.stdout.write(yaml.safe_dump(data, sort_keys=True, allow_unicode=True))
    elif fmt == "wide" or not wide:
        print_table(rows, headers)
    else:
        print_table([r[:-wide] for r in rows], headers[:-wide])


def structured(args: argparse.Namespace) -> bool:
    """True for ``-o json`` / ``-o yaml`` (commands with their own table layout use it)."""
    return getattr(args, "output", "table") in ("json", "yaml")


def run(fn):
    """Decorator for command functions: a :class:`CliError` prints ``error: ...`` and returns its
    exit code; a missing ``--job`` is a usage error."""

    def wrapper(args: argparse.Namespace) -> int:
        check_job(args)
        try:
            return int(fn(args) or 0)
        except CliError as e:
            sys.stderr.write(f"error: {e}\n")
            return e.exit_code

    wrapper.__name__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    return wrapper
