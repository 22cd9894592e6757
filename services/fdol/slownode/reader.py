"""Incremental reader of lightweight-profiling files (reference fdol.md §1.2–1.5, §2 "Reader").

Layout: ``<profiling root>/<job id>/<global rank>/`` holds data files named by their creation time
in Unix seconds (``1747645582``, no extension; the largest name is the one being appended to) and
``parallel_group.json``. :class:`RankTailer` tails one rank directory by byte offset: it returns
complete lines only (a partial last line waits for its ``\\n``), follows rotation to the next
numeric file once the current one is fully read and a newer one exists, survives the directory or
a file disappearing (aging) and a file shrinking, and reads at most ``max_read_bytes`` per poll
(bounded memory). Every rejected input is counted per reason in a :class:`BadInput`.

Fixes of reference quirks (named on purpose):
- *start file*: the reference starts at the first file whose name >= the parse start time, so the
  file being written when parsing starts is ignored until rotation; here the tailer starts at the
  newest file whose name <= ``start_time_s`` (or the oldest when all are newer / none given).
- *bad line*: the reference rolls the offset back on a line that fails JSON decoding and retries it
  forever; here a complete bad line is counted (``bad_json``) and skipped, only an unterminated last
  line is waited for.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from fdol import strictjson

from .records import BadInput, Record, parse_line

PARALLEL_GROUP_FILE = "parallel_group.json"


def _numeric_files(rank_dir: Path) -> list[int] | None:
    """Sorted numeric file names of ``rank_dir`` (regular files only), or None when it is gone."""
    try:
        with os.scandir(rank_dir) as it:
            out = []
            for e in it:
                if e.name.isdigit() and e.name.isascii():
                    try:
                        if e.is_file(follow_symlinks=False):
                            out.append(int(e.name))
                    except OSError:
                        continue
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError:
        return None
    out.sort()
    return out


class RankTailer:
    """Tails the numeric data files of one rank directory (see module doc).

    ``poll()`` -> list of :class:`Record` parsed since the last poll, in file order. Counters go to
    ``bad`` (shared or own). ``max_line_bytes`` bounds one line (longer ones are skipped and counted
    ``line_too_long``); ``max_read_bytes`` bounds the bytes read per poll.
    """

    def __init__(
        self,
        rank_dir: str | os.PathLike,
        *,
        start_time_s: int | None = None,
        bad: BadInput | None = None,
        max_line_bytes: int = 1 << 20,
        max_read_bytes: int = 8 << 20,
    ) -> None:
        self.rank_dir = Path(rank_dir)
        self.start_time_s = start_time_s
        self.bad = bad if bad is not None else BadInput()
        self.max_line_bytes = max_line_bytes
        self.max_read_bytes = max_read_bytes
        self.current: int | None = None  # numeric name of the file being read
        self.offset = 0  # byte offset in the current file (after the last consumed byte)
        self._partial = b""  # bytes of an unterminated line
        self._skipping = False  # inside an over-long line: drop bytes up to the next newline
        self._present = True
        self.lines = 0  # complete lines consumed (good or bad)

    def _pick_start(self, files: list[int]) -> int:
        if self.start_time_s is None:
            return files[0]
        older = [f for f in files if f <= self.start_time_s]
        return older[-1] if older else files[0]

    def poll(self) -> list[Record]:
        """Read what was appended since the last call. Never raises on bad files or input."""
        files = _numeric_files(self.rank_dir)
        if files is None:
            if self._present:
                self.bad.add("rank_dir_missing")
                self._present = False
            return []
        self._present = True
        if not files:
            return []
        if self.current is None:
            self.current = self._pick_start(files)
            self.offset = 0
        out: list[Record] = []
        budget = self.max_read_bytes
        while budget > 0:
            if self.current not in files:
                # Aged out or deleted under us: continue with the next newer file.
                self.bad.add("file_vanished")
                self._drop_partial()
                newer = [f for f in files if f > self.current]
                if not newer:
                    return out
                self.current, self.offset = newer[0], 0
                continue
            path = self.rank_dir / str(self.current)
            try:
                with open_regular(path) as fh:
                    size = os.fstat(fh.fileno()).st_size
                    if size < self.offset:
                        self.bad.add("file_truncated")
                        self.offset = 0
                        self._partial = b""
                        self._skipping = False
                    fh.seek(self.offset)
                    chunk = fh.read(min(budget, max(0, size - self.offset)))
            except FileNotFoundError:
                files = [f for f in files if f != self.current]
                continue
            except NotRegularFile:  # a FIFO or device where a record file belongs: never read
                self.bad.add("not_regular_file")
                newer = [f for f in files if f > self.current]
                if not newer:
                    return out
                self._drop_partial()
                self.current, self.offset = newer[0], 0
                continue
            except OSError:
                self.bad.add("file_unreadable")
                return out
            budget -= len(chunk)
            self.offset += len(chunk)
            self._consume(chunk, out)
            newer = [f for f in files if f > self.current]
            if self.offset >= size and newer:
                self._finish_file(out)
                self.current, self.offset = newer[0], 0
                continue
            break
        return out

    def _drop_partial(self) -> None:
        if self._partial and not self._skipping:
            self.bad.add("truncated_line")
        self._partial = b""
        self._skipping = False

    def _finish_file(self, out: list[Record]) -> None:
        """The file is final (a newer one exists): its unterminated tail is a last line or garbage."""
        if self._partial and not self._skipping:
            tail = self._partial
            self._partial = b""
            try:
                strictjson.loads(tail)
            except ValueError:
                self.bad.add("truncated_line")
                return
            self.lines += 1
            rec = parse_line(tail, self.bad)
            if rec is not None:
                out.append(rec)
        self._partial = b""
        self._skipping = False

    def _consume(self, chunk: bytes, out: list[Record]) -> None:
        if not chunk:
            return
        parts = chunk.split(b"\n")
        last = parts.pop()  # bytes after the last newline (b"" when the chunk ended with one)
        bad = self.bad
        for i, piece in enumerate(parts):
            if i == 0:
                if self._skipping:
                    self._skipping = False
                    self._partial = b""
                    continue
                if self._partial:
                    piece = self._partial + piece
                    self._partial = b""
            if len(piece) > self.max_line_bytes:
                bad.add("line_too_long")
                continue
            if not piece.strip():
                continue
            self.lines += 1
            rec = parse_line(piece, bad)
            if rec is not None:
                out.append(rec)
        if parts and not self._skipping:
            self._partial = last
        elif not self._skipping:
            self._partial += last
        if not self._skipping and len(self._partial) > self.max_line_bytes:
            bad.add("line_too_long")
            self._partial = b""
            self._skipping = True


@dataclass(frozen=True)
class Group:
    """One process group of parallel_group.json (§1.5): comm name (key), kind, global ranks."""

    comm_name: str
    group_name: str  # tp | pp | dp | cp | exp | default_group | ...
    global_ranks: tuple[int, ...]


def parse_parallel_groups(data: bytes) -> dict[str, Group]:
    """Parse parallel_group.json bytes -> {comm name: Group}. Raises ``ValueError`` with the reason."""
    try:
        obj = strictjson.loads(data)
    except ValueError as e:
        raise ValueError(f"not JSON: {e}") from None
    if not isinstance(obj, dict):
        raise ValueError("top level is not an object")
    out: dict[str, Group] = {}
    for key, g in obj.items():
        if not isinstance(g, dict):
            raise ValueError(f"group {key!r} is not an object")
        name = g.get("group_name")
        ranks = g.get("global_ranks")
        if not isinstance(name, str):
            raise ValueError(f"group {key!r}: group_name missing or not a string")
        if not isinstance(ranks, list) or not all(type(r) is int and r >= 0 for r in ranks):
            raise ValueError(f"group {key!r}: global_ranks must be a list of non-negative ints")
        out[key] = Group(key, name, tuple(sorted(set(ranks))))
    return out


def merge_groups(
    group_sets: list[dict[str, Group]], kinds: tuple[str, ...] = ("tp", "pp")
) -> dict[str, Group]:
    """Union of several ranks' groups keeping only ``kinds`` (§2 "group merge"): per comm name the
    global ranks are unioned, deduplicated and sorted."""
    merged: dict[str, tuple[str, set[int]]] = {}
    for gs in group_sets:
        for key, g in gs.items():
            if g.group_name not in kinds:
                continue
            _, ranks = merged.setdefault(key, (g.group_name, set()))
            ranks.update(g.global_ranks)
    return {k: Group(k, n, tuple(sorted(r))) for k, (n, r) in sorted(merged.items())}


MAX_GROUP_FILE_BYTES = 1 << 20  # a parallel_group.json beyond this is refused unread (bad_parallel_group)


class NotRegularFile(OSError):
    """A profiling path that is a FIFO, device or directory (never read: a FIFO would block)."""


def open_regular(path: str | os.PathLike):
    """``path`` opened for binary reading if it is a regular file (through symlinks); raises
    :class:`NotRegularFile` for a FIFO, device or directory -- opened non-blocking, so a FIFO never
    waits for a writer -- and ``OSError`` as ``open`` does."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularFile(f"{path} is not a regular file")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


class ParallelGroupFile:
    """Loads a rank's parallel_group.json when it appears or changes (by mtime and size).

    ``load()`` -> the current groups or None (absent or never parsed). A file that does not parse
    is counted once per version as ``bad_parallel_group``; the last good version is kept.
    """

    def __init__(self, path: str | os.PathLike, bad: BadInput) -> None:
        self.path = Path(path)
        self.bad = bad
        self.groups: dict[str, Group] | None = None
        self.error = ""
        self._stamp: tuple[int, int] | None = None

    def load(self) -> dict[str, Group] | None:
        try:
            st = self.path.stat()
        except OSError:
            return self.groups
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp == self._stamp:
            return self.groups
        self._stamp = stamp
        try:
            with open_regular(self.path) as fh:
                data = fh.read(MAX_GROUP_FILE_BYTES + 1)
            if len(data) > MAX_GROUP_FILE_BYTES:
                raise ValueError(f"larger than {MAX_GROUP_FILE_BYTES} bytes")
            self.groups = parse_parallel_groups(data)
            self.error = ""
        except (OSError, ValueError) as e:
            self.bad.add("bad_parallel_group")
            self.error = str(e)
        return self.groups


class JobReader:
    """Reads the ranks of one job: ``<root>/<job id>/<rank>/`` (§1.2).

    ``poll()`` -> {rank: [Record, ...]} of new records; ``groups(rank)`` -> that rank's parsed
    parallel groups or None. Ranks whose directory does not exist yet are retried each poll.
    """

    def __init__(
        self,
        job_dir: str | os.PathLike,
        ranks: list[int],
        *,
        start_time_s: int | None = None,
        max_read_bytes: int = 8 << 20,
    ) -> None:
        self.job_dir = Path(job_dir)
        self.bad = BadInput()
        self.tailers = {
            r: RankTailer(
                self.job_dir / str(r), start_time_s=start_time_s, bad=self.bad, max_read_bytes=max_read_bytes
            )
            for r in sorted(set(ranks))
        }
        self.group_files = {
            r: ParallelGroupFile(self.job_dir / str(r) / PARALLEL_GROUP_FILE, self.bad) for r in self.tailers
        }

    def poll(self) -> dict[int, list[Record]]:
        """New records per rank (ranks without new records are omitted)."""
        out = {}
        for r, t in self.tailers.items():
            self.group_files[r].load()
            recs = t.poll()
            if recs:
                out[r] = recs
        return out

    def groups(self, rank: int) -> dict[str, Group] | None:
        """The rank's parallel groups (last good parse) or None."""
        f = self.group_files.get(rank)
        return None if f is None else f.groups
