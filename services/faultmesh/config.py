"""Command-line configuration: flags > ``FAULTMESH_<FLAG>`` env > YAML ``--config`` > defaults.

Every service builds an ``argparse.ArgumentParser`` and calls :func:`parse` instead of
``parser.parse_args``. Flag ``--grpc-addr`` reads env ``FAULTMESH_GRPC_ADDR`` and YAML key
``grpc-addr`` (or ``grpc_addr``). Source: issue 2 "Command line".
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
import re
import typing
import weakref
from collections.abc import Sequence
from typing import Any, TypeVar

MAX_BODY_BYTES = 16 << 20
"""The largest HTTP request body a faultmesh daemon takes (bytes; aiohttp's ``client_max_size``);
the CLI refuses a larger file before it parses it. A job file of ``jobspec.MAX_RANKS`` ranks with
every rank field set is ~8.4 MiB as JSON."""
TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"0", "false", "no", "off", ""})


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_AGO = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")


MAX_MS = 2**63 - 1  # SQLite's integer range


def parse_since(text: str, now: int | None = None) -> int:
    """``since`` as ms since the epoch. Accepts a duration back from now (``90s``, ``30m``, ``12h``,
    ``2d``, ``1w``), an ISO 8601 / RFC 3339 time (``2026-12-01T08:00:00+00:00``; no offset = local
    time), or ms since the epoch. Raises ``ValueError`` with the accepted forms. Used by clusterd's
    ``GET /v1/events`` and to check ``faultmesh history --since`` before asking it."""
    from datetime import datetime

    text = text.strip()
    if now is None:
        from faultmesh.model import now_ms

        now = now_ms()
    try:
        m = _AGO.match(text)
        if m:
            v = now - int(float(m.group(1)) * _UNITS[m.group(2)] * 1000)
        elif text.isdigit():
            v = int(text)
        else:
            v = int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)
    except (ValueError, OverflowError):
        raise ValueError(
            f"since {text[:64]!r}: use a duration (30m, 12h, 2d), an RFC 3339 time or ms since the epoch"
        ) from None
    if v > MAX_MS:
        raise ValueError(f"since {text[:64]!r} is out of range (at most {MAX_MS} ms since the epoch)")
    return max(0, v)  # before the epoch: everything kept


def parse_duration_s(text: str) -> float:
    """A duration (``90s``, ``30m``, ``2h``, ``1d``, ``1w``, or plain seconds ``7200``) in seconds.
    Raises ``ValueError`` naming the accepted forms (a duration <= 0 is the caller's to refuse)."""
    t = text.strip()
    m = _AGO.match(t)
    try:
        return float(m.group(1)) * _UNITS[m.group(2)] if m else float(t)
    except ValueError:
        raise ValueError(f"duration {text[:64]!r}: use 90s, 30m, 2h, 1d, 1w or seconds") from None


def since_arg(text: str) -> str:
    """argparse type of a ``--since`` value: ``text`` when :func:`parse_since` reads it (the server
    resolves it against its own clock), else ``argparse.ArgumentTypeError`` (exit 2)."""
    try:
        parse_since(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


class ConfigError(ValueError):
    """A config file or env value that cannot be used (message names the key)."""


def _number(kind: type, lo: float, strict: bool, what: str):
    def check(text: Any) -> Any:
        try:
            v = kind(text)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"{text!r} is not a {what}") from None
        if v < lo or (strict and v == lo) or v != v:  # v != v: NaN
            raise argparse.ArgumentTypeError(f"{text!r} is not a {what}")
        return v

    check.__name__ = what.replace(" ", "_")
    check.kind = kind  # what the value is, for a section's field type (:func:`section_problems`)
    return check


positive_int = _number(int, 0, True, "positive integer")
positive_float = _number(float, 0.0, True, "positive number")
non_negative_float = _number(float, 0.0, False, "number >= 0")
"""argparse ``type=`` checks for counts, rates and periods: a value that would make the daemon
refuse every client (``--max-connections 0``, ``--unary-qps -1``) is a usage error at start."""


def bool_arg(text: str) -> bool:
    """argparse ``type=`` check of a yes/no value (:data:`TRUE_WORDS` / :data:`FALSE_WORDS`, any
    case); anything else is a usage error, not false."""
    word = str(text).strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS and word:
        return False
    raise argparse.ArgumentTypeError(f"{text!r}: use true or false")


def number_in(kind: type, lo: float, hi: float):
    """argparse ``type=`` check of a ``kind`` (int or float) in ``lo..hi``, both included (e.g. the
    demo's ``--bmc-poll`` 1..600 s, which noded would refuse only after the stack started)."""
    what = f"{'integer' if kind is int else 'number'} in {lo:g}..{hi:g}"
    base = _number(kind, lo, False, what)

    def check(text: Any) -> Any:
        v = base(text)
        if v > hi:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {what}")
        return v

    check.__name__ = base.__name__
    check.kind = kind
    return check


PORT_MAX = 65535
_PORT_SUFFIX = re.compile(r":(-?[0-9]+)$")


def check_port(port: int | str) -> int:
    """``port`` as an int in 0..65535 (the same words as the CLI's "Port out of range 0-65535").
    Raises ``ValueError``: the socket layer would take 99999 modulo 65536 (gRPC listened on 34463)."""
    try:
        n = int(port)
    except (TypeError, ValueError):
        raise ValueError(f"port {str(port)[:32]!r} is not a number") from None
    if not 0 <= n <= PORT_MAX:
        raise ValueError(f"Port out of range 0-{PORT_MAX}: {n}")
    return n


def check_address(text: str) -> str:
    """A ``host:port`` (``[v6]:port``, or a gRPC target such as ``dns:///host:port``) whose port, when
    it ends in one, is in 0..65535. Returns ``text``; raises ``ValueError`` (:func:`check_port`)."""
    m = _PORT_SUFFIX.search(text)
    if m and not text.endswith("]"):
        check_port(m.group(1))
    return text


def check_tls_pair(parser: argparse.ArgumentParser, args: argparse.Namespace, cert_what: str) -> None:
    """Usage error (exit 2, naming the missing flag) unless ``args.tls_cert`` and ``args.tls_key``
    come together: clusterd's server pair and the agents' client pair. The flags are named as the
    parser spells them (``--tls-cert``; an agent's ``--clusterd-tls-cert/--tls-cert``);
    ``cert_what`` says what the certificate is (``the PEM server certificate``)."""
    flags = {a.dest: "/".join(a.option_strings) for a in parser._actions if a.option_strings}
    cert, key = flags["tls_cert"], flags["tls_key"]
    if args.tls_cert and not args.tls_key:
        parser.error(f"{cert} needs {key} (the PEM private key of the certificate)")
    if args.tls_key and not args.tls_cert:
        parser.error(f"{key} needs {cert} ({cert_what})")


ADDRESS_DESTS = ("clusterd",)
"""Flags checked by :func:`parse` as addresses besides every ``--*-addr`` (``--grpc-addr``,
``--http-addr``, ``--sim-control-addr``): the agents' ``--clusterd host:port``. Every ``--*-port``
int flag (``--bmc-port``) is checked as a port."""


def _check_addresses(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Usage error (exit 2, naming the flag) for an address or port flag whose port is out of range."""
    for action in parser._actions:
        dest, value = action.dest, getattr(args, action.dest, None)
        if not action.option_strings or value is None or isinstance(value, bool):
            continue
        try:
            if dest.endswith("_addr") or dest in ADDRESS_DESTS:
                check_address(str(value))
            elif dest.endswith("_port") and isinstance(value, int):
                check_port(value)
        except ValueError as e:
            parser.error(f"argument {action.option_strings[0]}: {str(value)[:200]!r}: {e}")


def env_name(dest: str) -> str:
    """``grpc_addr`` -> ``FAULTMESH_GRPC_ADDR``."""
    return "FAULTMESH_" + dest.upper()


MAX_YAML_BYTES = 1 << 20
"""The largest YAML (not JSON) document a daemon parses from the network (bytes). PyYAML builds a
node per scalar before it constructs anything: 1 MiB of YAML took 5 s and ~200 MiB with libyaml
(28 s and ~360 MiB in pure Python) on the 2-core box, so a 16 MiB body (``MAX_BODY_BYTES``) would
hold clusterd for minutes and several GiB. JSON goes through orjson and is limited only by the body
size; ``faultmesh job apply`` sends JSON whatever the file was."""


class YamlTooLarge(ValueError):
    """A YAML document over the caller's byte limit (the message says how to send it instead)."""


def load_yaml(data: str | bytes, *, many: bool = False, max_bytes: int | None = None) -> Any:
    """Decode YAML (JSON is YAML 1.2) with PyYAML's safe loader, libyaml's when installed (5x faster,
    half the memory; its parser refuses nesting deeper than 1000).

    ``many``: every document of the stream, as a list. ``max_bytes``: refuse a longer text with
    :class:`YamlTooLarge` before parsing (network input: :data:`MAX_YAML_BYTES`). Raises
    ``ValueError`` naming the problem (cut to 200 characters) when the text is not YAML.
    """
    import yaml  # here, not at import: an agent given no YAML never loads PyYAML (issue 18)

    if max_bytes is not None and len(data) > max_bytes:
        raise YamlTooLarge(
            f"YAML document of {len(data)} bytes: the limit is {max_bytes} bytes for YAML; send it as JSON"
        )
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        return list(yaml.load_all(data, Loader=loader)) if many else yaml.load(data, Loader=loader)
    except (yaml.YAMLError, RecursionError) as e:
        raise ValueError(f"not YAML/JSON: {str(e)[:200] or 'nested too deeply'}") from None


def load_document(data: str | bytes, max_bytes: int | None = None) -> Any:
    """Decode a YAML (or JSON) document, e.g. a ConfigMap read from a file (:func:`load_yaml`).

    Returns the decoded value (None for an empty document). Raises ``ValueError`` naming the
    problem (cut to 200 characters) when the text is neither, :class:`YamlTooLarge` over
    ``max_bytes``.
    """
    return load_yaml(data, max_bytes=max_bytes)


_parse_gates: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # event loop -> its gate


async def parse_untrusted(fn, *args: Any) -> Any:
    """``fn(*args)`` in a worker thread, one at a time per event loop: the parse of a document from
    the network (a job spec, a pingmesh config) never stalls the loop, and many large bodies at
    once cost the memory of one parse, not of one per request."""
    import asyncio

    loop = asyncio.get_running_loop()
    gate = _parse_gates.get(loop)
    if gate is None:
        gate = _parse_gates[loop] = asyncio.Semaphore(1)  # an asyncio primitive serves one loop
    async with gate:
        return await asyncio.to_thread(fn, *args)


def _load_yaml(path: str) -> dict[str, Any]:
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f) or {}
    except UnicodeDecodeError:
        raise ConfigError(f"cannot read config file {path}: not UTF-8 text") from None
    except (OSError, yaml.YAMLError, RecursionError) as e:
        raise ConfigError(f"cannot read config file {path}: {str(e)[:200]}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


class DefaultsHelp(argparse.HelpFormatter):
    """Help that shows each option's default (``(default: 30.0)``) unless it has none (None, False,
    an empty string) or its help already says it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if "default" in text or default in (None, False, "", argparse.SUPPRESS) or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)"


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse ``argv`` with env and YAML fallbacks. Exits with status 2 on a bad value (argparse style;
    an env / YAML value of a flag with ``choices`` must be one of them, as on the command line; a
    port out of 0..65535 in an address or port flag, whatever its source: :func:`_check_addresses`)."""
    if not any(a.dest == "config" for a in parser._actions):
        parser.add_argument("--config", help="YAML file whose keys are flag names (env FAULTMESH_CONFIG)")
    if parser.formatter_class is argparse.HelpFormatter:  # a daemon's --help shows its defaults
        parser.formatter_class = DefaultsHelp
    if "--version" not in parser._option_string_actions:  # every daemon: "clusterd 0.1.0"
        from faultmesh.metrics import version

        parser.add_argument("--version", action="version", version=f"{parser.prog} {version()}")
    pre, _ = parser.parse_known_args(argv)
    file_values: dict[str, Any] = {}
    cfg_path = getattr(pre, "config", None) or os.environ.get(env_name("config"))
    if cfg_path:
        try:
            file_values = _load_yaml(cfg_path)
        except ConfigError as e:
            parser.error(str(e))
    known = {a.dest for a in parser._actions if a.option_strings}
    unknown = sorted(k for k in file_values if k not in known)
    if unknown:
        hints = []
        for k in unknown:
            close = difflib.get_close_matches(k, known, n=1)
            hints.append(
                k.replace("_", "-") + (f" (did you mean {close[0].replace('_', '-')}?)" if close else "")
            )
        parser.error(f"config file {cfg_path}: unknown keys: {', '.join(hints)}")
    defaults: dict[str, Any] = {}
    for action in parser._actions:
        dest = action.dest
        if dest in ("help", "config") or not action.option_strings:
            continue
        raw: Any = None
        if env_name(dest) in os.environ:
            raw = os.environ[env_name(dest)]
        elif dest in file_values:
            raw = file_values[dest]
        if raw is None:
            continue
        bad = f"bad value for {dest} from env/config: {str(raw)[:200]!r}"
        if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
            word = str(raw).lower()
            if isinstance(raw, bool):
                val = raw
            elif isinstance(raw, str | int) and word in TRUE_WORDS | FALSE_WORDS:
                val = word in TRUE_WORDS
            else:  # "fasle" must not silently mean false
                parser.error(f"{bad} (use true or false)")
        elif isinstance(action, argparse._AppendAction):
            val = raw if isinstance(raw, list) else [s for s in str(raw).split(",") if s]
            if not all(isinstance(x, str | int | float) and not isinstance(x, bool) for x in val):
                parser.error(f"{bad} (a list of values expected)")
            val = [str(x) for x in val]
        else:
            if isinstance(raw, bool) and action.choices is not None and {"on", "off"} & set(action.choices):
                raw = "on" if raw else "off"  # YAML 1.1 reads a bare on / off as a boolean
            if isinstance(raw, bool) or not isinstance(raw, str | int | float):
                parser.error(
                    f"{bad} (a {'number' if action.type in (int, float) else 'single value'} expected)"
                )
            val = raw if action.type is not None else str(raw)
            if action.type is not None:
                try:
                    val = action.type(raw)
                except (TypeError, ValueError, argparse.ArgumentTypeError) as e:
                    parser.error(f"{bad} ({e})")
            if action.choices is not None and val not in action.choices:
                allowed = ", ".join(map(str, action.choices))
                parser.error(f"bad value for {dest} from env/config: {raw!r} (use one of {allowed})")
        defaults[dest] = val
    parser.set_defaults(**defaults)
    args = parser.parse_args(argv)
    _check_addresses(parser, args)
    return args


class BadSecretFile(OSError):
    """A secret file (token, password) that is empty or not UTF-8: refused like an unreadable one,
    never taken as "no secret" (an empty mounted Secret must not turn authentication off)."""


def read_secret(path: str | None, env: str | None = None, what: str = "secret file") -> str | None:
    """Read a secret (password, token) from a file (stripped) or else from env var ``env``; never
    logged. ``what`` names the file in errors (the flag, e.g. ``--token-file``). Raises
    :class:`BadSecretFile` (an ``OSError``) when the file is unreadable, empty or not UTF-8."""
    if path:
        try:
            with open(path, encoding="utf-8") as f:
                secret = f.read().strip()
        except UnicodeDecodeError:
            raise BadSecretFile(f"{what} {path} is not UTF-8 text") from None
        except OSError as e:
            raise BadSecretFile(f"cannot read {what} {path}: {e.strerror or e}") from None
        if not secret:
            raise BadSecretFile(f"{what} {path} is empty")
        return secret
    if env:
        return os.environ.get(env)
    return None


S = TypeVar("S")


def section(cls: type[S], args: argparse.Namespace) -> S:
    """The typed configuration section ``cls`` of the parsed command line ``args`` (issue 28).

    ``cls`` is a frozen dataclass whose fields are named after flags' dests (``kube_api`` holds
    ``--kube-api``) and have no defaults: the parser is the one source of defaults, and the daemon's
    wiring builds each section once from what :func:`parse` returned, then hands a component its
    section, never the ``Namespace``. A field typed with another section holds that section (a part's
    own flags: ``KubeConfig.leader``), built from the same ``args``. Raises ``ConfigError`` naming the
    flags ``args`` lacks (a section read from a parser that does not define them).
    :func:`section_problems` checks a section against its parser (names, types, docstring).
    """
    hints = typing.get_type_hints(cls)
    parts = {
        f.name: hints[f.name] for f in dataclasses.fields(cls) if dataclasses.is_dataclass(hints[f.name])
    }
    names = [f.name for f in dataclasses.fields(cls) if f.name not in parts]
    missing = [n for n in names if n not in vars(args)]
    if missing:
        flags = ", ".join("--" + n.replace("_", "-") for n in missing)
        raise ConfigError(f"{cls.__name__}: the command line has no {flags}")
    values = {n: vars(args)[n] for n in names}
    return cls(**values, **{n: section(part, args) for n, part in parts.items()})


def _flag_kind(action: argparse.Action) -> type:
    """The Python type of a flag's value: bool for a switch, else its ``type=`` (or the checker's
    ``kind``), else its default's type, else str."""
    if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
        return bool
    if isinstance(action, argparse._AppendAction):
        return list
    if isinstance(action.type, type):
        return action.type
    kind = getattr(action.type, "kind", None)  # a checker of this module: positive_int, number_in
    if kind is not None:
        return kind
    return type(action.default) if action.default is not None else str


def section_problems(cls: type, parser: argparse.ArgumentParser) -> list[str]:
    """What is wrong with section ``cls`` (:func:`section`) for ``parser``: a field that is no flag's
    dest, a field with a default (a second source of defaults), a field whose type is not the flag's
    (``T | None`` exactly when the flag's default is None), a flag the class docstring does not
    name (``--kube-api``), a class that is not a frozen dataclass. Empty when it is sound."""
    if not dataclasses.is_dataclass(cls) or not cls.__dataclass_params__.frozen:
        return [f"{cls.__name__} is not a frozen dataclass"]
    actions = {a.dest: a for a in parser._actions if a.option_strings}
    hints = typing.get_type_hints(cls)
    doc = cls.__doc__ or ""
    out = []
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):  # a part's own section
            out.extend(section_problems(hints[f.name], parser))
            continue
        action = actions.get(f.name)
        if action is None:
            out.append(f"{cls.__name__}.{f.name}: no flag of {parser.prog} has this dest")
            continue
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
            out.append(f"{cls.__name__}.{f.name}: has a default (the parser's is the one default)")
        kind = _flag_kind(action)
        want = kind | None if action.default is None and kind is not bool else kind
        if hints[f.name] != want:
            out.append(f"{cls.__name__}.{f.name}: typed {hints[f.name]}, the flag gives {want}")
        flag = max(action.option_strings, key=len)
        if flag not in doc:
            out.append(f"{cls.__name__}: the docstring does not name {flag}")
    return out
