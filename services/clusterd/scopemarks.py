"""Scope marks of the fault center (issue 18, the unchanged resync of :mod:`clusterd.ingest.agents`).

A mark is opaque bytes held for one scope ``(node, origin)`` (an agent's faults on its node): an
agent snapshot's digest and node view. :class:`~clusterd.center.FaultCenter` sets it with the
replace op that carries it and drops it when any key of the scope changes afterwards, and stores
either in the same transaction as the faults of that batch (the ``scope_marks`` table of
:class:`~clusterd.store.Store`). So a mark is only ever held, in memory and on disk, for the very
state the op that set it left.
"""

from __future__ import annotations

Scope = tuple[str, str]


class ScopeMarks:
    """The held marks (scope -> bytes) and, for the batch being applied, what it changed.

    Per batch: :meth:`set` for every scope an op touched, then :meth:`writes` (scope -> new mark or
    None) for the store, then :meth:`done` once committed or :meth:`undo` when the commit failed.
    """

    def __init__(self) -> None:
        self.held: dict[Scope, bytes] = {}
        self._before: dict[Scope, bytes | None] = {}  # scope -> its mark before this batch

    def get(self, scope: Scope) -> bytes | None:
        """The mark held for ``scope`` (None: none)."""
        return self.held.get(scope)

    def set(self, scope: Scope, mark: bytes | None) -> None:
        """Make ``mark`` (None: none) the mark of ``scope`` within the batch being applied."""
        old = self.held.get(scope)
        if old == mark:
            return
        self._before.setdefault(scope, old)
        if mark is None:
            del self.held[scope]
        else:
            self.held[scope] = mark

    def writes(self) -> dict[Scope, bytes | None]:
        """What this batch changed: scope -> new mark (None: delete), for the store's transaction."""
        return {scope: self.held.get(scope) for scope in self._before}

    def done(self) -> None:
        """The batch was committed."""
        self._before = {}

    def undo(self) -> None:
        """The batch's commit failed: every mark back as it was before it."""
        for scope, mark in self._before.items():
            if mark is None:
                self.held.pop(scope, None)
            else:
                self.held[scope] = mark
        self._before = {}
