"""Per-node output kept between scrapes: which nodes changed (:class:`NodeChanges`) and each node's
rendered piece kept in name order, joined in chunks (:class:`SortedPieces`) (issue 18).

The ``/metrics`` node families and the ``/v1/nodes`` list are one piece per node in node-name order.
At 16k nodes, visiting every node to ask whether it changed costs more than the rendering saved,
so the writers say which nodes changed: the fault center on every fault of a node it puts or
drops, the node registry on every change of a node's state (identity, statuses, conditions,
devices, pending, stale, agent clocks: an agent stream's connect and disconnect touch it too).
Each reader holds its own set of changed names, takes it at the next scrape and re-renders only
those nodes; only the chunks holding a changed node are joined again.
"""

from __future__ import annotations

from bisect import bisect_right, insort
from collections.abc import Iterable
from typing import Generic, TypeVar

T = TypeVar("T", str, bytes)

CHUNK = 256  # nodes per chunk: a change re-joins ~CHUNK pieces, a scrape joins n / CHUNK chunks


class ChangeReader:
    """One reader's node names changed since its last :meth:`take` (filled by :meth:`NodeChanges.mark`)."""

    def __init__(self) -> None:
        self.pending: set[str] = set()

    def take(self) -> set[str]:
        """The names changed since the last call (and start a new set)."""
        out, self.pending = self.pending, set()
        return out


class NodeChanges:
    """The node-change feed: writers :meth:`mark` a node, each :meth:`reader` sees every mark once.
    A reader's set holds each name once, so it is bounded by the number of nodes."""

    def __init__(self) -> None:
        self._readers: list[ChangeReader] = []

    def reader(self) -> ChangeReader:
        """A new reader; it sees the marks from now on (render everything once first)."""
        r = ChangeReader()
        self._readers.append(r)
        return r

    def mark(self, node: str) -> None:
        """Something shown for ``node`` may have changed (or the node appeared / went away)."""
        for r in self._readers:
            r.pending.add(node)


class SortedPieces(Generic[T]):
    """``key -> piece`` (str or bytes) in sorted key order; :meth:`join` = ``sep.join(pieces in key
    order)``. Kept in chunks of about :data:`CHUNK` keys, each with its joined text cached: a
    :meth:`put` or :meth:`drop` re-joins only its chunk at the next :meth:`join`."""

    def __init__(self, sep: T, chunk: int = CHUNK) -> None:
        self._sep: T = sep
        self._chunk = chunk
        self._pieces: dict[str, T] = {}
        self._keys: list[list[str]] = []  # sorted keys, chunked
        self._firsts: list[str] = []  # each chunk's first key
        self._joined: list[T | None] = []  # each chunk's joined pieces (None: to join)

    def reset(self, pieces: Iterable[tuple[str, T]]) -> None:
        """Replace everything with ``pieces`` ((key, piece), any order)."""
        self._pieces = dict(pieces)
        keys = sorted(self._pieces)
        c = self._chunk
        self._keys = [keys[i : i + c] for i in range(0, len(keys), c)]
        self._firsts = [k[0] for k in self._keys]
        self._joined = [None] * len(self._keys)

    def __contains__(self, key: object) -> bool:
        return key in self._pieces

    def __len__(self) -> int:
        return len(self._pieces)

    def get(self, key: str) -> T | None:
        """``key``'s piece, or None."""
        return self._pieces.get(key)

    def _at(self, key: str) -> int:
        return max(0, bisect_right(self._firsts, key) - 1)

    def put(self, key: str, piece: T) -> None:
        """Set ``key``'s piece (a new key is inserted in order)."""
        had = key in self._pieces
        if had and self._pieces[key] == piece:
            return
        self._pieces[key] = piece
        if not self._keys:
            self._keys, self._firsts, self._joined = [[key]], [key], [None]
            return
        i = self._at(key)
        self._joined[i] = None
        if had:
            return
        keys = self._keys[i]
        insort(keys, key)
        self._firsts[i] = keys[0]
        if len(keys) > 2 * self._chunk:  # split a grown chunk in two
            half = len(keys) // 2
            self._keys[i : i + 1] = [keys[:half], keys[half:]]
            self._firsts[i : i + 1] = [keys[0], keys[half]]
            self._joined[i : i + 1] = [None, None]

    def drop(self, key: str) -> None:
        """Remove ``key`` (nothing when absent)."""
        if self._pieces.pop(key, None) is None:
            return
        i = self._at(key)
        keys = self._keys[i]
        keys.remove(key)
        if keys:
            self._firsts[i] = keys[0]
            self._joined[i] = None
        else:
            del self._keys[i], self._firsts[i], self._joined[i]

    def join(self) -> T:
        """Every piece in key order, joined by ``sep``."""
        sep, pieces, joined = self._sep, self._pieces, self._joined
        for i, j in enumerate(joined):
            if j is None:
                joined[i] = sep.join([pieces[k] for k in self._keys[i]])
        return sep.join(joined)  # type: ignore[arg-type]
