"""Table reload (reference deviced.md §1.1 fault-config polling, §4.2 re-applying the config).

Every ``--table-reload-interval`` s (300; 0 = never) the table files given by flags are looked at
with :class:`faultmesh.files.FileWatch`; when any changed, each is re-read on its own (a file that
fails keeps its old table, logged with its reason and counted in ``failures``, exported as
``faultmesh_deviced_table_reload_failures_total{table}``) and the engine re-levels its escalations.
The relation tables (``--relation-fault-file``, ``--fault-duration-file``) go to the
:class:`deviced.relations.RelationRules` stage.

Overrides (``deviced --kube``: the ``mindx-dl-fault-config`` ConfigMap, :mod:`deviced.faultconfig`):
:meth:`TableReloader.apply_overrides` puts a table's text in force over its file; while an
override holds, a change of that file is not applied; an override that goes away (key removed, the
ConfigMap deleted) gives the table back to its file (or faultmesh's default), as the reference
device plugin falls back to its files.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import logging
from collections.abc import Callable
from typing import Any, NamedTuple

from deviced.engine import FaultEngine
from deviced.relations import RelationRules
from deviced.sections import ReloadConfig
from deviced.switch import SwitchState
from deviced.tables import (
    MAX_TABLE_BYTES,
    Customization,
    FaultCodeTable,
    SwitchFaultTable,
    TableError,
    load_fault_duration,
    load_relations,
)
from faultmesh.faultrules import DurationTable, RelationTable
from faultmesh.files import FileWatch
from faultmesh.log import event

log = logging.getLogger("deviced")


class Tables(NamedTuple):
    """deviced's fault tables as loaded from the files its flags name (faultmesh's defaults)."""

    codes: FaultCodeTable
    customization: Customization
    switch: SwitchFaultTable
    relations: RelationTable
    duration: DurationTable


def load_tables(args: argparse.Namespace) -> Tables:
    """Every table of ``args`` (``--fault-code-file`` ...; with ``--backend nvml`` the NVIDIA table
    gives the codes and rules unless those files are named). Raises :class:`TableError`."""
    codes, custom = None, None
    backend = args.backend
    if backend == "nvml" or (backend == "sim" and args.sim_vendor == "nvidia"):
        from deviced.nvml_table import NvidiaTable

        nv = NvidiaTable.load(args.nvml_fault_table)
        codes, custom = nv.codes, nv.custom
    return Tables(
        FaultCodeTable.load(args.fault_code_file) if codes is None or args.fault_code_file else codes,
        Customization.load(args.fault_customization_file)
        if custom is None or args.fault_customization_file
        else custom,
        SwitchFaultTable.load(args.switch_fault_code_file),
        load_relations(args.relation_fault_file),
        load_fault_duration(args.fault_duration_file),
    )


class TableReloader:
    """Watches and reloads the flag-given table files (``cfg``, :class:`deviced.sections.ReloadConfig`)
    into ``engine`` and ``switch``."""

    def __init__(
        self,
        cfg: ReloadConfig,
        engine: FaultEngine,
        switch: SwitchState,
        wake: Callable[[], None],
        relations: RelationRules | None = None,
    ) -> None:
        self.cfg = cfg
        self.engine = engine
        self.switch = switch
        self.wake = wake
        self.relations = relations
        self.failures: collections.Counter[str] = collections.Counter()
        self.overrides: dict[str, str] = {}  # table name -> the override text in force
        self.loaders = {
            "faultCode.json": (FaultCodeTable.load, FaultCodeTable.from_obj, cfg.fault_code_file),
            "faultCustomization.json": (
                Customization.load, Customization.from_obj, cfg.fault_customization_file
            ),
            "SwitchFaultCode.json": (
                SwitchFaultTable.load, SwitchFaultTable.from_obj, cfg.switch_fault_code_file
            ),
        }  # fmt: skip
        self.files = [
            (name, loader, path)
            for name, loader, path in (
                ("faultCode.json", FaultCodeTable.load, cfg.fault_code_file),
                ("faultCustomization.json", Customization.load, cfg.fault_customization_file),
                ("SwitchFaultCode.json", SwitchFaultTable.load, cfg.switch_fault_code_file),
                ("relationFaultCustomization.json", load_relations, cfg.relation_fault_file),
                ("faultDuration.json", load_fault_duration, cfg.fault_duration_file),
            )
            if path
        ]
        self.watches = [FileWatch(path) for _, _, path in self.files]

    def reload(self) -> bool:
        """Re-read every flag-given file, each on its own (a table under an override is left as it
        is). Returns True when every file read loaded."""
        loaded: dict[str, Any] = {}
        tried = 0
        for name, loader, path in self.files:
            if name in self.overrides:
                continue
            tried += 1
            try:
                loaded[name] = loader(path)
            except TableError as e:
                self.failures[name] += 1
                event(log, logging.ERROR, "fault table reload failed", table=name, error=str(e))
        self._apply(loaded)
        return len(loaded) == tried

    def reject(self, table: str, where: str, why: str) -> None:
        """Count (``failures[table]``) and log one refused table or key; nothing changes."""
        self.failures[table] += 1
        event(log, logging.ERROR, "fault table override rejected", table=table, source=where, error=why)

    def apply_overrides(self, texts: dict[str, str | None], where: str) -> list[str]:
        """Put override texts in force: ``texts`` maps a table name (``faultCode.json``,
        ``faultCustomization.json``, ``SwitchFaultCode.json``) to its JSON text, or to None to give
        the table back to its file / default. Unchanged texts are skipped; a text that does not
        parse or validate is refused with :meth:`reject` and the table in force stays. ``where``
        names the source in logs. Returns the names of the tables that changed."""
        loaded: dict[str, Any] = {}
        for name, text in texts.items():
            load, from_obj, path = self.loaders[name]
            if text is None:
                if name not in self.overrides:
                    continue
                try:
                    loaded[name] = load(path)
                except TableError as e:  # the file broke meanwhile: the override stays
                    self.reject(name, str(path), str(e))
                    continue
                del self.overrides[name]
                continue
            if self.overrides.get(name) == text:
                continue
            try:
                loaded[name] = parse_text(text, from_obj, f"{where} key {name}")
            except TableError as e:
                self.reject(name, where, str(e))
                continue
            self.overrides[name] = text
        if loaded:
            self._apply(loaded, source=where)
        return sorted(loaded)

    def _apply(self, loaded: dict[str, Any], source: str = "files") -> None:
        n = self.engine.reload(loaded.get("faultCode.json"), loaded.get("faultCustomization.json"))
        if "SwitchFaultCode.json" in loaded:
            self.switch.table = loaded["SwitchFaultCode.json"]
        if self.relations is not None and (
            "relationFaultCustomization.json" in loaded or "faultDuration.json" in loaded
        ):
            self.relations.set_tables(
                loaded.get("relationFaultCustomization.json"), loaded.get("faultDuration.json")
            )
        event(
            log, logging.INFO, "fault tables reloaded",
            tables=",".join(sorted(loaded)), source=source, reasons_changed=n,
        )  # fmt: skip
        self.wake()

    def changed(self) -> bool:
        """True when any watched file changed since the last look (every watch is updated)."""
        return any([w.changed() for w in self.watches])

    async def run(self) -> None:
        """The watch loop (until cancelled)."""
        self.changed()  # the files as loaded at start
        while True:
            await asyncio.sleep(self.cfg.table_reload_interval)
            if self.changed():
                self.reload()


def parse_text(text: str, from_obj: Callable[[Any, str], Any], where: str) -> Any:
    """One table from its JSON ``text`` with ``from_obj(obj, where)`` (e.g.
    :meth:`deviced.tables.FaultCodeTable.from_obj`). Raises :class:`TableError` (too large, not
    JSON, wrong shape)."""
    size = len(text.encode("utf-8", "replace"))
    if size > MAX_TABLE_BYTES:
        raise TableError(f"{where}: {size} bytes, larger than {MAX_TABLE_BYTES}")
    try:
        obj = json.loads(text)
    except ValueError as e:
        raise TableError(f"{where}: not JSON: {e}") from None
    return from_obj(obj, where)
