"""Table reload (reference deviced.md §1.1 fault-config polling, §4.2 re-applying the config).

Every ``--table-reload-interval`` s (300; 0 = never) the table files given by flags are looked at
with :class:`faultmesh.files.FileWatch`; when any changed, each is re-read on its own (a file that
fails keeps its old table, logged with its reason and counted in ``failures``, exported as
``faultmesh_deviced_table_reload_failures_total{table}``) and the engine re-levels its escalations.
The relation tables (``--relation-fault-file``, ``--fault-duration-file``) go to the
:class:`deviced.relations.RelationRules` stage.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import logging
from collections.abc import Callable
from typing import Any

from deviced.engine import FaultEngine
from deviced.relations import RelationRules
from deviced.switch import SwitchState
from deviced.tables import (
    Customization,
    FaultCodeTable,
    SwitchFaultTable,
    TableError,
    load_fault_duration,
    load_relations,
)
from faultmesh.files import FileWatch
from faultmesh.log import event

log = logging.getLogger("deviced")


class TableReloader:
    """Watches and reloads the flag-given table files into ``engine`` and ``switch``."""

    def __init__(
        self,
        args: argparse.Namespace,
        engine: FaultEngine,
        switch: SwitchState,
        wake: Callable[[], None],
        relations: RelationRules | None = None,
    ) -> None:
        self.args = args
        self.engine = engine
        self.switch = switch
        self.wake = wake
        self.relations = relations
        self.failures: collections.Counter[str] = collections.Counter()
        self.files = [
            (name, loader, path)
            for name, loader, path in (
                ("faultCode.json", FaultCodeTable.load, args.fault_code_file),
                ("faultCustomization.json", Customization.load, args.fault_customization_file),
                ("SwitchFaultCode.json", SwitchFaultTable.load, args.switch_fault_code_file),
                (
                    "relationFaultCustomization.json",
                    load_relations,
                    getattr(args, "relation_fault_file", None),
                ),
                ("faultDuration.json", load_fault_duration, getattr(args, "fault_duration_file", None)),
            )
            if path
        ]
        self.watches = [FileWatch(path) for _, _, path in self.files]

    def reload(self) -> bool:
        """Re-read every flag-given file, each on its own. Returns True when every file loaded."""
        loaded: dict[str, Any] = {}
        for name, loader, path in self.files:
            try:
                loaded[name] = loader(path)
            except TableError as e:
                self.failures[name] += 1
                event(log, logging.ERROR, "fault table reload failed", table=name, error=str(e))
        n = self.engine.reload(loaded.get("faultCode.json"), loaded.get("faultCustomization.json"))
        if "SwitchFaultCode.json" in loaded:
            self.switch.table = loaded["SwitchFaultCode.json"]
        if self.relations is not None and (
            "relationFaultCustomization.json" in loaded or "faultDuration.json" in loaded
        ):
            self.relations.set_tables(
                loaded.get("relationFaultCustomization.json"), loaded.get("faultDuration.json")
            )
        event(log, logging.INFO, "fault tables reloaded", tables=",".join(sorted(loaded)), reasons_changed=n)
        self.wake()
        return len(loaded) == len(self.files)

    def changed(self) -> bool:
        """True when any watched file changed since the last look (every watch is updated)."""
        return any([w.changed() for w in self.watches])

    async def run(self) -> None:
        """The watch loop (until cancelled)."""
        self.changed()  # the files as loaded at start
        while True:
            await asyncio.sleep(self.args.table_reload_interval)
            if self.changed():
                self.reload()
