"""Input the CLI can check, checked (issue 31): "did you mean" for node names, fault codes and levels
(:mod:`difflib`, the standard library's close-match ratio), and the one "node not known" error
(exit 4) that ``faults``, ``nodes``, ``history`` and ``pubfault send`` give for a node clusterd has
never seen.
"""

from __future__ import annotations

import argparse
import difflib
import json
import urllib.parse
from collections.abc import Iterable
from functools import cache
from pathlib import Path

from faultmesh.levels import KNOWN_LEVELS
from fmtools.cli.common import NotFound, http_json

MAX_SUGGESTIONS = 3
CUTOFF = 0.6  # difflib's ratio: "srever-1" ~ "server-1" 0.75, "node-1" ~ "server-1" 0.57


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """`` (did you mean 'a' or 'b'?)`` for the up to :data:`MAX_SUGGESTIONS` ``candidates`` closest
    to ``word`` (case-insensitive), or ``""`` when none is close."""
    by_low: dict[str, str] = {}
    for c in candidates:
        by_low.setdefault(c.lower(), c)
    close = difflib.get_close_matches(word.lower(), list(by_low), n=MAX_SUGGESTIONS, cutoff=CUTOFF)
    if not close:
        return ""
    return " (did you mean " + " or ".join(repr(by_low[c]) for c in close) + "?)"


def known_nodes(args: argparse.Namespace) -> list[str]:
    """Every node name clusterd knows (GET /v1/nodes)."""
    return [n["name"] for n in http_json(args, "GET", "/v1/nodes")]


def unknown_node(args: argparse.Namespace, node: str, hint: str = "") -> NotFound:
    """The :class:`NotFound` (exit 4) for ``node``: ``clusterd does not know node 'X' (did you mean
    ...?)`` plus ``hint``."""
    return NotFound(f"clusterd does not know node {node!r}{did_you_mean(node, known_nodes(args))}{hint}")


def get_node(args: argparse.Namespace, node: str, hint: str = "") -> dict:
    """GET /v1/nodes/<node>: the node's summary with its faults and devices. Raises
    :func:`unknown_node`'s :class:`NotFound` (exit 4) when clusterd has never seen it."""
    try:
        return http_json(args, "GET", "/v1/nodes/" + urllib.parse.quote(node, safe=""))
    except NotFound:
        raise unknown_node(args, node, hint) from None


def level_arg(value: str) -> str:
    """argparse ``type`` for a fault level: one of :data:`faultmesh.levels.KNOWN_LEVELS` (any case),
    else ``ArgumentTypeError`` (exit 2) with the closest names."""
    for level in KNOWN_LEVELS:
        if level.lower() == value.lower():
            return level
    raise argparse.ArgumentTypeError(
        f"unknown level {value!r}{did_you_mean(value, KNOWN_LEVELS)}; levels: {', '.join(sorted(KNOWN_LEVELS))}"
    )


@cache
def public_codes() -> frozenset[str]:
    """The codes of the public fault table faultmesh ships (clusterd/tables/publicFaultConfiguration.json);
    empty when it cannot be read (an operator's clusterd may use its own table)."""
    path = Path(__file__).resolve().parents[2] / "clusterd" / "tables" / "publicFaultConfiguration.json"
    try:
        table = json.loads(path.read_text())["publicFaultCode"]
        return frozenset(c for codes in table.values() for c in codes)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return frozenset()
