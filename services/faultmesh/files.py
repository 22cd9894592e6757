"""Files: one atomic write and one change detector for every faultmesh service.

- :func:`atomic_write` writes ``data`` to a temporary file beside ``path``, fsyncs it and renames it
  over ``path`` (POSIX rename is atomic: a reader sees the old or the new document, never half).
- :class:`FileWatch` tells whether one file changed since the last look, by (mtime_ns, size) and,
  when those moved, the sha256 of the content (a touch without a change is no change).
- :class:`DirWatch` does the same for the files of a folder that match a glob pattern.

Source: issue 12 ("has this file changed is detected six ways; atomic_write exists four times").
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DirWatch", "FileWatch", "Stamp", "atomic_write", "stamp"]


def atomic_write(path: str | os.PathLike[str], data: bytes | str, mode: int | None = None) -> None:
    """Replace ``path`` with ``data`` atomically (temp file in the same folder, fsync, rename).

    ``data`` (bytes, or str written as UTF-8); ``mode`` (e.g. 0o644) sets the file's permission bits,
    default: the umask's. Raises ``OSError`` (the old file is left untouched and the temp removed).
    """
    p = Path(path)
    raw = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=p.parent or ".", prefix=f".{p.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        else:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


@dataclass(frozen=True, slots=True)
class Stamp:
    """What a look at a file saw: ``mtime_ns`` (ns), ``size`` (bytes)."""

    mtime_ns: int
    size: int


def stamp(path: str | os.PathLike[str]) -> Stamp | None:
    """The file's :class:`Stamp`, or None when it does not exist or cannot be stat'ed."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return Stamp(st.st_mtime_ns, st.st_size)


def _digest(path: str | os.PathLike[str]) -> str | None:
    try:
        with open(path, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except OSError:
        return None


class FileWatch:
    """Change detector for one file.

    ``changed()`` is True on the first look when the file exists, then each time its content
    differs from the last look (appeared, removed, rewritten). Cheap: a stat per look; the file is
    hashed only when (mtime_ns, size) moved. ``content_hash=False`` trusts the stat alone (for big
    append-only files).
    """

    def __init__(self, path: str | os.PathLike[str], content_hash: bool = True) -> None:
        self.path = Path(path)
        self.content_hash = content_hash
        self._stamp: Stamp | None = None
        self._digest: str | None = None
        self._seen = False

    def changed(self) -> bool:
        """True when the file changed since the last call (see class doc). Never raises."""
        st = stamp(self.path)
        if self._seen and st == self._stamp:
            return False
        first = not self._seen
        self._seen = True
        self._stamp = st
        if st is None:
            had = self._digest is not None
            self._digest = None
            return had
        if not self.content_hash:
            return True
        digest = _digest(self.path)
        if digest == self._digest and not first:
            return False
        self._digest = digest
        return digest is not None or not first

    def forget(self) -> None:
        """Make the next :meth:`changed` report the file as new (e.g. after a rejected reload)."""
        self._seen = False
        self._stamp = None
        self._digest = None


class DirWatch:
    """Change detector for the files of ``folder`` matching ``pattern`` (glob, default ``*``).

    ``changes()`` returns the names (relative to ``folder``) that appeared, changed or vanished since
    the last call, by (mtime_ns, size). Never raises (an unreadable folder reads as empty).
    """

    def __init__(self, folder: str | os.PathLike[str], pattern: str = "*") -> None:
        self.folder = Path(folder)
        self.pattern = pattern
        self._stamps: dict[str, Stamp] = {}

    def scan(self) -> dict[str, Stamp]:
        """The current {name: Stamp} of the matching regular files."""
        out: dict[str, Stamp] = {}
        try:
            entries = list(self.folder.glob(self.pattern))
        except OSError:
            return out
        for e in entries:
            st = stamp(e)
            if st is not None and e.is_file():
                out[str(e.relative_to(self.folder))] = st
        return out

    def names(self) -> set[str]:
        """The names present at the last :meth:`changes` (so ``changes() - names()`` = vanished)."""
        return set(self._stamps)

    def changes(self) -> set[str]:
        """Names that appeared, changed or vanished since the last call."""
        now = self.scan()
        old = self._stamps
        self._stamps = now
        return {n for n in now.keys() | old.keys() if now.get(n) != old.get(n)}
