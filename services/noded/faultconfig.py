"""``noded --kube``: the reference NodeD's fault-level ConfigMap ``mindx-dl-node-fault-config``
(reference noded.md §2 "Override"; issue 13).

The ConfigMap (namespace ``--kube-fault-config-namespace``, ``mindx-dl``) holds one key,
``NodeDConfiguration.json``: the level table in the file's format. Each new version is validated
as the file is (:meth:`noded.levels.LevelTableWatcher.apply_text`: codes of 8 letters/digits, a
code in two levels refuses the whole table) and, when good, is in force at once over
``--levels-file`` / faultmesh's default; the node's faults are re-levelled and re-published. As the
reference: a deleted ConfigMap only logs (the last table stays); the file is not read again while
the ConfigMap's table is in force.

Bad input is refused, logged ("fault config rejected") and counted in
``noded_level_table_reloads_total{result}``: ``invalid`` (not JSON, wrong shape, over 256 KiB, a value
that is not a string), ``unknown-key`` (a key other than ``NodeDConfiguration.json``), ``missing``
(no ``NodeDConfiguration.json`` key).

Deliberate difference: the reference ignores the Add event of a ConfigMap created after NodeD
started (it honours only its first Update); faultmesh applies it.
"""

from __future__ import annotations

import logging

from faultmesh.kubecm import (
    ConfigMapFollower,
    add_fault_config_arguments,
    config_map_values,
    fault_config_follower,
)
from faultmesh.log import event
from noded.levels import LevelTableWatcher

log = logging.getLogger("noded.levels")

NAME = "mindx-dl-node-fault-config"
KEY = "NodeDConfiguration.json"
MAX_VALUE_BYTES = 256 * 1024


class NodeFaultConfigMap:
    """Feeds each version of the ConfigMap (``on_configmap(obj)``: a raw object, None = deleted)
    to ``watcher``. ``where`` names the ConfigMap in logs."""

    def __init__(self, watcher: LevelTableWatcher, where: str) -> None:
        self.watcher = watcher
        self.where = where

    def _reject(self, result: str, why: str) -> None:
        self.watcher.rejected += 1
        self.watcher.on_reject(result)
        event(log, logging.WARNING, "fault config rejected", path=self.where, error=why,
              kept=self.watcher.table.digest[:12])  # fmt: skip

    def on_configmap(self, obj: dict | None) -> bool:
        """Apply one version. Returns True when a new table took effect."""
        if obj is None:
            event(log, logging.INFO, "fault config configmap deleted, the last table stays", path=self.where)
            return False
        values, bad = config_map_values(obj, MAX_VALUE_BYTES)
        for key, why in bad:
            self._reject("invalid" if key in (KEY, "data") else "unknown-key", f"{key}: {why}")
        for key in sorted(set(values) - {KEY}):
            self._reject("unknown-key", f"unknown key {key[:80]!r} (known: {KEY})")
        if KEY in values:
            return self.watcher.apply_text(values[KEY], f"{self.where} key {KEY}", MAX_VALUE_BYTES)
        if not any(k == KEY for k, _ in bad):
            self._reject("missing", f"no key {KEY}")
        return False


def add_arguments(parser) -> None:
    """``--kube-fault-config`` and ``--kube-fault-config-namespace`` (``mindx-dl``)."""
    add_fault_config_arguments(parser, "Kubernetes (fault levels, as the reference NodeD)", NAME, "mindx-dl")


def follower(
    args, watcher: LevelTableWatcher | None
) -> tuple[ConfigMapFollower | None, NodeFaultConfigMap | None]:
    """(follower, consumer) for ``args``; (None, None) without ``--kube``, with
    ``--kube-fault-config off`` or without a level table (no BMC source)."""
    if watcher is None:
        return None, None
    return fault_config_follower(args, NAME, lambda where: NodeFaultConfigMap(watcher, where))
