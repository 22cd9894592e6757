"""Feature exclusions of resumable training (issue 32 item 9), shared by deviced and ClusterD.

Graceful fault tolerance (优雅容错: deviced ``--grace-tolerance``, the device plugin's hot-reset
mode) and process-level recovery do not run together. The reference's user guide (断点续训原理,
"使用约束" of 优雅容错, 进程级别重调度 and 进程级在线恢复): graceful tolerance cannot be on together
with process-level rescheduling (``recover``, ``recover-in-place``) or process-level online
recovery (``retry``); if both are on, training is recovered by Job-level rescheduling. Elastic
training is stated as not combinable with graceful tolerance either; it rides on the same
process-recovery switch and is excluded the same way.

- A deviced in graceful-tolerance mode says so in its Hello: label :data:`GRACE_LABEL` =
  :data:`ON` (``faultmesh.v1.Hello.labels``).
- A job "has process-level recovery" (:func:`process_level_recovery`) when its
  ``process-recover-enable`` is ``on`` (or ``pause``: the controller paused it) and its
  ``recover-strategy`` names one of :data:`PROCESS_LEVEL_STRATEGIES`.
- ClusterD hands the faults of such a job with a rank on a graceful-tolerance node to Job-level
  rescheduling (clusterd.brain.graceexcl); deviced runs no grace episode for it (deviced.grace).
"""

from __future__ import annotations

from collections.abc import Iterable

GRACE_LABEL = "graceTolerance"
"""The Hello label of a deviced in graceful-tolerance mode (value :data:`ON`)."""
ON = "on"

PROCESS_LEVEL_STRATEGIES = frozenset({"retry", "recover", "recover-in-place", "elastic-training"})
"""recover-strategy values of process-level recovery (online recovery, process-level rescheduling,
its in-place form, elastic training): each excludes graceful tolerance."""


def process_level_recovery(process_recover_enable: str, recover_strategy: Iterable[str]) -> bool:
    """Whether a job with these labels runs process-level recovery: ``process_recover_enable`` is
    ``on`` or ``pause`` and ``recover_strategy`` (the label's values, unknown ones ignored) names one
    of :data:`PROCESS_LEVEL_STRATEGIES`."""
    return process_recover_enable in ("on", "pause") and any(
        s in PROCESS_LEVEL_STRATEGIES for s in recover_strategy
    )


def grace_mode(labels: dict[str, str]) -> bool:
    """Whether an agent's Hello labels say graceful-tolerance mode (``graceTolerance=on``)."""
    return labels.get(GRACE_LABEL) == ON
