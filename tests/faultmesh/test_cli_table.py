"""The CLI's tables off a terminal are laid out directly (20,000 rows took rich ~50 s; tryout) and
read exactly as rich lays them out: the same columns, widths (CJK cells count two) and spacing."""

from __future__ import annotations

import io
import random

from rich.console import Console
from rich.table import Table
from rich.text import Text

from fmtools.cli.common import print_table


def rich_text(rows, headers) -> str:
    """The table as print_table's rich path prints it off a terminal."""
    t = Table(box=None, show_edge=False, pad_edge=False, padding=(0, 2, 0, 0), header_style="")
    for h in headers:
        t.add_column(str(h), no_wrap=True, overflow="fold")
    for r in rows:
        t.add_row(*(Text("" if c is None else str(c)) for c in r))
    buf = io.StringIO()
    Console(file=buf, width=100_000, force_terminal=False, color_system=None).print(t)
    return "".join(line.rstrip() + "\n" for line in buf.getvalue().splitlines())


def test_the_plain_layout_is_rich_s_layout():
    rnd = random.Random(7)
    cells = ["a", "bb", "node-17", "", "慢节点故障", "x y", "RestartNPU", "k=v,k2=v2", None, 12, "é"]
    for _ in range(200):
        n = rnd.randint(1, 6)
        headers = [rnd.choice(["NODE", "ID", "A", "LONG HEADER", "名称"]) for _ in range(n)]
        rows = [[rnd.choice(cells) for _ in range(n)] for _ in range(rnd.randint(0, 8))]
        out = io.StringIO()
        print_table(rows, headers, out)
        assert out.getvalue() == rich_text(rows, headers), (headers, rows)
