"""Typed configuration sections (issue 28): each clusterd component gets a frozen dataclass built once
from the parsed command line, whose fields are the flags' dests with the flags' types and no second
default; the parser stays the one source of defaults."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import pytest

from clusterd.app import SECTIONS, build_parser
from faultmesh import config


@pytest.mark.parametrize("cls", SECTIONS, ids=lambda c: c.__name__)
def test_each_section_matches_the_parser(cls):
    assert config.section_problems(cls, build_parser()) == []


def test_a_section_takes_the_parsers_defaults_and_values():
    from clusterd.history import HistoryConfig

    parser = build_parser()
    assert config.section(HistoryConfig, parser.parse_args([])) == HistoryConfig(7 * 86400.0, 1_000_000, 60.0)
    got = config.section(HistoryConfig, parser.parse_args(["--history-max-rows", "5"]))
    assert got.history_max_rows == 5


@dataclass(frozen=True)
class _Good:
    """``--count``, ``--name``, ``--on``."""

    count: int
    name: str | None
    on: bool


@dataclass(frozen=True)
class _Bad:
    """Names only ``--count``."""

    count: float
    name: str
    missing: int
    on: bool = False


@dataclass
class _Loose:
    """``--count``."""

    count: int


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="t")
    p.add_argument("--count", type=config.positive_int, default=3)
    p.add_argument("--name")
    p.add_argument("--on", action="store_true")
    return p


def test_the_check_catches_each_breach():
    assert config.section_problems(_Good, _parser()) == []
    assert config.section_problems(_Bad, _parser()) == [
        "_Bad.count: typed <class 'float'>, the flag gives <class 'int'>",
        "_Bad.name: typed <class 'str'>, the flag gives str | None",
        "_Bad: the docstring does not name --name",
        "_Bad.missing: no flag of t has this dest",
        "_Bad.on: has a default (the parser's is the one default)",
        "_Bad: the docstring does not name --on",
    ]
    assert config.section_problems(_Loose, _parser()) == ["_Loose is not a frozen dataclass"]


def test_a_flag_the_command_line_lacks_is_named():
    with pytest.raises(config.ConfigError, match="_Good: the command line has no --name, --on"):
        config.section(_Good, argparse.Namespace(count=1))
    assert config.section(_Good, _parser().parse_args(["--on"])) == _Good(3, None, True)


def _fields(cls) -> set[str]:
    """The flag dests a section holds, its parts' included."""
    import dataclasses
    import typing

    hints = typing.get_type_hints(cls)
    out: set[str] = set()
    for f in dataclasses.fields(cls):
        out |= _fields(hints[f.name]) if dataclasses.is_dataclass(hints[f.name]) else {f.name}
    return out


def test_every_clusterd_flag_is_in_a_section():
    """A new flag of clusterd lands in a component's section (or the brain's flags, which it still
    reads from the whole Namespace; or the log flags, read before ClusterD exists)."""
    from clusterd.brain.component import BrainComponent

    probe = argparse.ArgumentParser(add_help=False)
    BrainComponent.add_arguments(probe)
    brain = {a.dest for a in probe._actions}
    covered = set().union(*(_fields(cls) for cls in SECTIONS))
    flags = {a.dest for a in build_parser()._actions if a.option_strings and a.dest != "help"}
    assert flags - covered - brain == {"log_level", "log_file", "log_format"}
