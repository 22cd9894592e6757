"""Typed configuration sections of deviced's actions and table reloader (issue 28;
:func:`faultmesh.config.section`): frozen dataclasses whose fields are the flags of
:func:`deviced.flags.build_parser` they read, with the flags' types and no defaults of their own
(the parser's are the one source); :class:`deviced.app.DeviceD` builds each once.
``tests/deviced/test_sections.py`` checks them against the parser.
"""

from __future__ import annotations

from dataclasses import dataclass

from faultmesh import config


@dataclass(frozen=True)
class HotResetConfig:
    """The hot-reset action (:class:`deviced.hotreset.HotReset`): ``hot_reset`` ``--hot-reset`` (on),
    ``hot_reset_idle`` ``--hot-reset-idle`` (s idle before a reset), ``hot_reset_boot_timeout``
    ``--hot-reset-boot-timeout`` (s), ``hot_reset_budget`` ``--hot-reset-budget`` resets per chip
    per ``hot_reset_window_s`` ``--hot-reset-window-s`` (s)."""

    hot_reset: bool
    hot_reset_idle: float
    hot_reset_boot_timeout: float
    hot_reset_budget: int
    hot_reset_window_s: float


@dataclass(frozen=True)
class GraceConfig:
    """The graceful-tolerance action (:class:`deviced.grace.GraceFlow`): ``grace_tolerance``
    ``--grace-tolerance`` (on), its waits (s) ``grace_processes_timeout_s``
    ``--grace-processes-timeout-s``, ``grace_error_clean_s`` ``--grace-error-clean-s``,
    ``grace_npu_ready_s`` ``--grace-npu-ready-s``, ``list_watch_period``
    ``--list-watch-period`` (s; the reset-config refresh is 3 periods), ``grace_reset_group``
    ``--grace-reset-group`` (chips; 0: by product), and the reset budget it
    shares with the hot reset: ``hot_reset_budget`` ``--hot-reset-budget`` resets per chip per
    ``hot_reset_window_s`` ``--hot-reset-window-s`` (s)."""

    grace_tolerance: bool
    grace_processes_timeout_s: float
    grace_error_clean_s: float
    grace_npu_ready_s: float
    list_watch_period: int
    grace_reset_group: int
    hot_reset_budget: int
    hot_reset_window_s: float


@dataclass(frozen=True)
class ReloadConfig:
    """The table files (:class:`deviced.reload.TableReloader`; None: faultmesh's table):
    ``fault_code_file`` ``--fault-code-file``, ``fault_customization_file``
    ``--fault-customization-file``, ``switch_fault_code_file`` ``--switch-fault-code-file``,
    ``relation_fault_file`` ``--relation-fault-file``, ``fault_duration_file``
    ``--fault-duration-file``; ``table_reload_interval`` ``--table-reload-interval`` (s; 0: off)."""

    fault_code_file: str | None
    fault_customization_file: str | None
    switch_fault_code_file: str | None
    relation_fault_file: str | None
    fault_duration_file: str | None
    table_reload_interval: float


def build(args) -> tuple[HotResetConfig, GraceConfig, ReloadConfig]:
    """The sections of the parsed command line ``args``, each built once
    (:func:`faultmesh.config.section`; ``ConfigError`` names a flag ``args`` lacks)."""
    return (
        config.section(HotResetConfig, args),
        config.section(GraceConfig, args),
        config.section(ReloadConfig, args),
    )
