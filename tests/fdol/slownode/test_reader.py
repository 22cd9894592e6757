"""The profiling-file reader: incremental tail, rotation, partial lines, bad input per reason."""

from __future__ import annotations

import json
import os
import shutil

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fdol.slownode.reader import (
    JobReader,
    ParallelGroupFile,
    RankTailer,
    merge_groups,
    parse_parallel_groups,
)
from fdol.slownode.records import BadInput, Record, encode_record, parse_line


def rec_line(i: int) -> bytes:
    return encode_record(2 if i % 2 == 0 else 4, 0, 1_000_000 + i, i // 2, f"step {i}", "default")


def test_parse_line_reasons():
    bad = BadInput()
    assert parse_line(b"garbage", bad) is None
    assert parse_line(b'{"Kind":1,"Flag":2', bad) is None
    assert parse_line(b"[1,2]", bad) is None
    assert parse_line(b'{"Kind":1}', bad) is None
    assert parse_line(b'{"Kind":1,"Flag":2,"SourceKind":0,"Timestamp":"x","Id":1}', bad) is None
    assert parse_line(b'{"Kind":3,"Flag":2,"SourceKind":0,"Timestamp":5,"Id":1}', bad) is None
    assert parse_line(b'{"Kind":1,"Flag":7,"SourceKind":0,"Timestamp":5,"Id":1}', bad) is None
    assert parse_line(b'{"Kind":1,"Flag":2,"SourceKind":0,"Timestamp":-5,"Id":1}', bad) is None
    assert dict(bad) == {
        "bad_json": 2,
        "not_object": 1,
        "missing_field": 1,
        "bad_type": 1,
        "not_marker": 1,
        "bad_flag": 1,
        "bad_timestamp": 1,
    }
    r = parse_line(encode_record(16, 1, 99, 7, "forward", "default"), bad)
    assert r == Record(16, 1, 99, 7, "forward", "default")
    r = parse_line(encode_record(32, 1, 100, 7), bad)  # NULL name/domain -> ""
    assert r == Record(32, 1, 100, 7, "", "")


def test_tail_partial_line_and_rotation(tmp_path):
    d = tmp_path / "0"
    d.mkdir()
    f1 = d / "1000"
    line0, line1, line2 = rec_line(0), rec_line(1), rec_line(2)
    f1.write_bytes(line0 + line1[:10])
    t = RankTailer(d)
    assert [r.ts for r in t.poll()] == [1_000_000]
    assert t.poll() == []  # the partial line waits
    with open(f1, "ab") as fh:
        fh.write(line1[10:])
    assert [r.ts for r in t.poll()] == [1_000_001]
    (d / "1005").write_bytes(line2)
    (d / "parallel_group.json").write_text("{}")  # not a data file
    assert [r.ts for r in t.poll()] == [1_000_002]
    assert t.current == 1005
    assert sum(t.bad.values()) == 0


def test_rotation_with_truncated_tail_counts(tmp_path):
    d = tmp_path / "0"
    d.mkdir()
    (d / "1000").write_bytes(rec_line(0) + b'{"Kind":1,"Fl')
    (d / "1001").write_bytes(rec_line(1))
    t = RankTailer(d)
    assert [r.ts for r in t.poll()] == [1_000_000, 1_000_001]
    assert t.bad["truncated_line"] == 1


def test_dir_vanishes_and_returns(tmp_path):
    d = tmp_path / "3"
    d.mkdir()
    (d / "1000").write_bytes(rec_line(0))
    t = RankTailer(d)
    assert len(t.poll()) == 1
    shutil.rmtree(d)
    assert t.poll() == [] and t.poll() == []
    assert t.bad["rank_dir_missing"] == 1
    d.mkdir()
    (d / "1002").write_bytes(rec_line(1))
    assert [r.ts for r in t.poll()] == [1_000_001]
    assert t.bad["file_vanished"] == 1


def test_file_shrinks_is_counted(tmp_path):
    d = tmp_path / "0"
    d.mkdir()
    f = d / "1000"
    f.write_bytes(rec_line(0) + rec_line(1))
    t = RankTailer(d)
    assert len(t.poll()) == 2
    f.write_bytes(rec_line(2))
    assert [r.ts for r in t.poll()] == [1_000_002]
    assert t.bad["file_truncated"] == 1


def test_start_file_is_the_one_being_written(tmp_path):
    """Fix of the reference quirk: the file created just before the start time is read."""
    d = tmp_path / "0"
    d.mkdir()
    (d / "900").write_bytes(rec_line(0))
    (d / "990").write_bytes(rec_line(1))
    (d / "1010").write_bytes(rec_line(2))
    t = RankTailer(d, start_time_s=1000)
    assert [r.ts for r in t.poll()] == [1_000_001, 1_000_002]


def test_long_line_skipped_and_budget_bounds_reads(tmp_path):
    d = tmp_path / "0"
    d.mkdir()
    (d / "1000").write_bytes(b"x" * 5000 + b"\n" + rec_line(0) + rec_line(1))
    t = RankTailer(d, max_line_bytes=1000, max_read_bytes=600)
    got = []
    for _ in range(40):
        got += t.poll()
    assert [r.ts for r in got] == [1_000_000, 1_000_001]
    assert t.bad["line_too_long"] == 1


def test_parallel_groups_parse_merge_and_bad(tmp_path):
    g = parse_parallel_groups(
        json.dumps(
            {
                "tp_comm_1": {"group_name": "tp", "group_rank": 0, "global_ranks": [1, 0]},
                "pp_comm_2": {"group_name": "pp", "group_rank": 0, "global_ranks": [0, 4]},
                "default": {"group_name": "default_group", "group_rank": 0, "global_ranks": [0, 1, 4, 5]},
            }
        ).encode()
    )
    assert g["tp_comm_1"].global_ranks == (0, 1)
    g2 = {"tp_comm_1": g["tp_comm_1"].__class__("tp_comm_1", "tp", (2, 3))}
    m = merge_groups([g, g2])
    assert list(m) == ["pp_comm_2", "tp_comm_1"]
    assert m["tp_comm_1"].global_ranks == (0, 1, 2, 3)
    bad = BadInput()
    p = tmp_path / "parallel_group.json"
    f = ParallelGroupFile(p, bad)
    assert f.load() is None
    p.write_text("{not json")
    assert f.load() is None and bad["bad_parallel_group"] == 1
    assert f.load() is None and bad["bad_parallel_group"] == 1  # counted once per version
    p.write_text(json.dumps({"a_1": {"group_name": "tp", "global_ranks": [0, 1]}}))
    os.utime(p, ns=(1, 10**18))
    assert f.load()["a_1"].global_ranks == (0, 1)
    for text in ('{"a": 1}', '{"a": {"group_name": "tp", "global_ranks": [-1]}}', "[]"):
        try:
            parse_parallel_groups(text.encode())
            raise AssertionError("should not parse")
        except ValueError:
            pass


def test_job_reader_missing_rank_dir(tmp_path):
    (tmp_path / "job" / "0").mkdir(parents=True)
    (tmp_path / "job" / "0" / "1000").write_bytes(rec_line(0))
    jr = JobReader(tmp_path / "job", [0, 1])
    out = jr.poll()
    assert list(out) == [0]
    assert jr.bad["rank_dir_missing"] == 1


GOOD = st.integers(min_value=0, max_value=10_000).map(rec_line)
GARBAGE = st.sampled_from(
    [
        b"garbage\n",
        b'{"Kind":1,"Flag":\n',
        b"[]\n",
        b"\n",
        b'{"Kind":2,"Flag":2,"SourceKind":0,"Timestamp":1,"Id":1}\n',
    ]
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    lines=st.lists(st.tuples(st.booleans(), GOOD, GARBAGE), min_size=1, max_size=40),
    cuts=st.lists(st.integers(min_value=0, max_value=4000), max_size=8),
    rotate_at=st.lists(st.integers(min_value=0, max_value=39), max_size=3),
    budget=st.integers(min_value=64, max_value=5000),
)
def test_property_tail_yields_every_good_record_once_in_order(
    tmp_path_factory, lines, cuts, rotate_at, budget
):
    """Whatever the write chunking, rotation points and read budget, the tailer returns exactly the
    good records in order and counts every garbage line (empty lines are not counted)."""
    d = tmp_path_factory.mktemp("rank")
    stream: list[bytes] = []
    expected = []
    garbage = 0
    for good, g_line, b_line in lines:
        if good:
            stream.append(g_line)
            expected.append(parse_line(g_line, BadInput()))
        else:
            stream.append(b_line)
            garbage += b_line.strip() != b""
    # Files: rotate only at line boundaries (the producer appends whole batches).
    files: list[list[bytes]] = [[]]
    for i, ln in enumerate(stream):
        if i in rotate_at and files[-1]:
            files.append([])
        files[-1].append(ln)
    t = RankTailer(d, max_read_bytes=budget)
    got = []
    name = 1000
    for chunk_lines in files:
        data = b"".join(chunk_lines)
        pos = 0
        points = sorted({c % (len(data) + 1) for c in cuts} | {len(data)})
        for p in points:
            with open(d / str(name), "ab") as fh:
                fh.write(data[pos:p])
            pos = p
            got += t.poll()
        name += 1
    for _ in range(200):
        more = t.poll()
        if not more and t.offset >= os.path.getsize(d / str(t.current)):
            break
        got += more
    assert got == expected
    counted = sum(v for k, v in t.bad.items())
    assert counted == garbage


def test_fifo_and_huge_files_are_refused_unread_and_counted(tmp_path):
    # a FIFO where parallel_group.json belongs blocked noded's reader thread forever (tryout); a
    # FIFO where a record file belongs too; a 700 MB group file was read whole before refusal
    import threading

    from fdol.slownode.reader import MAX_GROUP_FILE_BYTES

    rank = tmp_path / "job" / "0"
    rank.mkdir(parents=True)
    os.mkfifo(rank / "parallel_group.json")
    os.mkfifo(rank / "1000")
    (rank / "1001").write_bytes(rec_line(7))
    jr = JobReader(tmp_path / "job", [0])
    got: dict = {}
    t = threading.Thread(target=lambda: got.update(out=jr.poll(), groups=jr.groups(0)), daemon=True)
    t.start()
    t.join(5)
    assert not t.is_alive(), "the reader blocked on a FIFO"
    assert got["out"][0] == [parse_line(rec_line(7).rstrip(b"\n"), BadInput())]  # the next file is read
    assert got["groups"] is None
    assert jr.bad["bad_parallel_group"] == 1  # (a FIFO record file is not even listed)
    big = tmp_path / "big.json"
    with open(big, "wb") as fh:
        fh.truncate(MAX_GROUP_FILE_BYTES + 10)
    bad = BadInput()
    f = ParallelGroupFile(big, bad)
    assert f.load() is None and bad["bad_parallel_group"] == 1 and "larger than" in f.error
