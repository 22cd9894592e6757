"""faultmesh.files: the one atomic write and change detector."""

from __future__ import annotations

import os

import pytest

from faultmesh.files import DirWatch, FileWatch, atomic_write


def test_atomic_write_replaces_and_leaves_no_temp(tmp_path):
    p = tmp_path / "doc.json"
    atomic_write(p, b"one")
    atomic_write(p, "two")
    assert p.read_text() == "two"
    assert sorted(os.listdir(tmp_path)) == ["doc.json"]


def test_atomic_write_mode(tmp_path):
    p = tmp_path / "secret"
    atomic_write(p, b"x", mode=0o600)
    assert p.stat().st_mode & 0o777 == 0o600


def test_atomic_write_failure_keeps_old_file(tmp_path):
    p = tmp_path / "d" / "doc"
    with pytest.raises(OSError):
        atomic_write(p, b"x")  # folder missing
    q = tmp_path / "doc"
    q.write_text("old")
    os.chmod(tmp_path, 0o500)
    try:
        if os.access(tmp_path, os.W_OK):  # root ignores the mode bits
            pytest.skip("running as root: a read-only folder is still writable")
        with pytest.raises(OSError):
            atomic_write(q, b"new")
        assert q.read_text() == "old"
    finally:
        os.chmod(tmp_path, 0o700)


def test_file_watch_sees_create_change_touch_and_remove(tmp_path):
    p = tmp_path / "table.json"
    w = FileWatch(p)
    assert w.changed() is False  # absent from the start: nothing to load
    p.write_text("a")
    assert w.changed() is True
    assert w.changed() is False
    os.utime(p, ns=(1, 1))  # touched, same content
    assert w.changed() is False
    p.write_text("bb")
    assert w.changed() is True
    p.unlink()
    assert w.changed() is True
    assert w.changed() is False


def test_file_watch_first_look_and_forget(tmp_path):
    p = tmp_path / "t"
    p.write_text("x")
    w = FileWatch(p)
    assert w.changed() is True
    assert w.changed() is False
    w.forget()
    assert w.changed() is True


def test_dir_watch_names_what_moved(tmp_path):
    (tmp_path / "a.csv").write_text("1")
    (tmp_path / "b.txt").write_text("1")
    w = DirWatch(tmp_path, "*.csv")
    assert w.changes() == {"a.csv"}
    assert w.changes() == set()
    (tmp_path / "a.csv").write_text("12")
    (tmp_path / "c.csv").write_text("1")
    assert w.changes() == {"a.csv", "c.csv"}
    (tmp_path / "c.csv").unlink()
    assert w.changes() == {"c.csv"}
    assert DirWatch(tmp_path / "missing").changes() == set()
