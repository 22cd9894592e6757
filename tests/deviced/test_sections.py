"""deviced's typed configuration sections (issue 28): each matches deviced's parser (flag dests, types,
no second default, every flag named in its docstring) and takes the parser's values."""

from __future__ import annotations

import pytest

from deviced import sections
from deviced.flags import build_parser
from faultmesh import config


@pytest.mark.parametrize(
    "cls", [sections.HotResetConfig, sections.GraceConfig, sections.ReloadConfig], ids=lambda c: c.__name__
)
def test_each_section_matches_the_parser(cls):
    assert config.section_problems(cls, build_parser()) == []


def test_the_sections_hold_the_parsed_values():
    args = build_parser().parse_args(
        ["--hot-reset", "--hot-reset-budget", "5", "--table-reload-interval", "0"]
    )
    hot, grace, reload_cfg = sections.build(args)
    assert (hot.hot_reset, hot.hot_reset_budget, hot.hot_reset_window_s) == (True, 5, 6 * 3600.0)
    assert (grace.grace_tolerance, grace.list_watch_period) == (False, 5)
    assert (reload_cfg.table_reload_interval, reload_cfg.fault_code_file) == (0.0, None)
