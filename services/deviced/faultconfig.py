"""``deviced --kube``: the reference device plugin's fault-table ConfigMap ``mindx-dl-fault-config``
(reference deviced.md §1.1 "Fault-config CM polling", §9; issue 13).

The ConfigMap (namespace ``--kube-fault-config-namespace``, ``kube-system`` as the reference's
``api.KubeNS``) carries the keys ``faultCode.json``, ``faultCustomization.json``,
``SwitchFaultCode.json`` (each the table's JSON text, the same format as the files) and
``PollInterval`` (s, 30..3600). A key present overrides that table's file (``--fault-code-file``
etc., else faultmesh's default); a key absent, or the ConfigMap deleted, gives the table back to its
file. A change takes effect at once (the tables are re-applied and the engine re-levels its
escalations, as a file reload does: :meth:`deviced.reload.TableReloader.apply_overrides`).

Bad input is refused, logged ("fault table override rejected") and counted in
``faultmesh_deviced_table_reload_failures_total{table}``: a table that is not JSON, has the wrong
shape or is over 256 KiB (label: the table), a value that is not a string (the table's name, or
``unknown-key``), a key faultmesh does not know (``unknown-key``), a ``PollInterval`` that is not an
integer in 30..3600 (``PollInterval``).

Deliberate differences (docs/compatibility.md): the ConfigMap is watched, not polled every
``PollInterval`` s, so ``PollInterval`` is checked but changes nothing; a bad table keeps the table
in force (the last good one) instead of falling back to the file; unknown keys are counted.
"""

from __future__ import annotations

import logging

from deviced.reload import TableReloader
from faultmesh.kubecm import (
    ConfigMapFollower,
    add_fault_config_arguments,
    config_map_values,
    fault_config_follower,
)
from faultmesh.log import event

log = logging.getLogger("deviced")

NAME = "mindx-dl-fault-config"
TABLE_KEYS = ("faultCode.json", "faultCustomization.json", "SwitchFaultCode.json")
POLL_KEY = "PollInterval"
POLL_RANGE = (30, 3600)
UNKNOWN = "unknown-key"
MAX_VALUE_BYTES = 256 * 1024  # 8x the reference's largest default table (faultCode.json, ~30 KiB)


class FaultConfigMap:
    """Turns each version of the ConfigMap (``on_configmap(obj)``, a raw object or None) into
    :meth:`TableReloader.apply_overrides` calls. ``where`` names the ConfigMap in logs."""

    def __init__(self, reloader: TableReloader, where: str) -> None:
        self.reloader = reloader
        self.where = where
        self.applied = 0  # versions handled (tests, metrics)

    def on_configmap(self, obj: dict | None) -> list[str]:
        """Apply one version of the ConfigMap (None: deleted). Returns the tables that changed."""
        values, bad = config_map_values(obj, MAX_VALUE_BYTES)
        texts: dict[str, str | None] = {}
        for key, why in bad:
            self.reloader.reject(key if key in TABLE_KEYS else UNKNOWN, self.where, f"{key}: {why}")
            if key in TABLE_KEYS:
                texts[key] = self.reloader.overrides.get(key)  # keep what is in force
        for key in sorted(set(values) - set(TABLE_KEYS) - {POLL_KEY}):
            self.reloader.reject(
                UNKNOWN, self.where, f"unknown key {key[:80]!r} (known: {', '.join(TABLE_KEYS)}, {POLL_KEY})"
            )
        if POLL_KEY in values:
            self._check_poll(values[POLL_KEY])
        for key in TABLE_KEYS:
            texts.setdefault(key, values.get(key))
        self.applied += 1
        changed = self.reloader.apply_overrides(texts, self.where)
        event(
            log, logging.INFO, "handling fault config configmap change complete",
            configmap=self.where, deleted=obj is None, changed=",".join(changed) or "-",
        )  # fmt: skip
        return changed

    def _check_poll(self, text: str) -> None:
        lo, hi = POLL_RANGE
        try:
            v = int(text.strip())
        except ValueError:
            v = None
        if v is None or not lo <= v <= hi:
            self.reloader.reject(
                POLL_KEY, self.where, f"{POLL_KEY} {text[:40]!r} is not an integer in {lo}..{hi}"
            )


def add_arguments(parser) -> None:
    """``--kube-fault-config`` and ``--kube-fault-config-namespace`` (``kube-system``)."""
    add_fault_config_arguments(
        parser, "Kubernetes (fault tables, as the reference device plugin)", NAME, "kube-system"
    )


def follower(args, reloader: TableReloader) -> tuple[ConfigMapFollower | None, FaultConfigMap | None]:
    """(follower, consumer) for ``args``: a :class:`faultmesh.kubecm.ConfigMapFollower` (start and
    stop it) feeding a :class:`FaultConfigMap`; (None, None) without ``--kube`` or with
    ``--kube-fault-config off``."""
    return fault_config_follower(args, NAME, lambda where: FaultConfigMap(reloader, where))
