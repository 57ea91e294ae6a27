"""Piped tables (80 columns): ids are never cut; other columns wrap, then are left out, first
(issue 9 item 16)."""

from __future__ import annotations

from rich.table import Table

from gpuctl.cli.output import print_table

SLICE = "GPU-4fe05c4c-eb90-4afe-a9a9-39bd10ece2f9/3"


def _table(rows: int = 3) -> Table:
    t = Table(title="reassign research -> training (request r-0123456789ab)", title_justify="left")
    for col in ("node", "GPU", "slice", "fraction", "result"):
        t.add_column(col, no_wrap=col != "result")  # as the verbs build them
    for i in range(rows):
        t.add_row(f"sim-{i:02d}", str(i), SLICE[:-1] + str(i), "1/4",
                  "NOT moved: node refused: the slice is leased by lease-0123456789ab (use --drain or --revoke)")
    return t


def test_ids_are_whole_in_80_columns_and_other_columns_wrap(capsys, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    # Before: the slice column was squeezed to "GPU-4fe05c4c-eb90-4…" in a pipe
    dropped = print_table(_table())
    out, err = capsys.readouterr()
    assert dropped == ["fraction"]  # the reason (result) stays, wrapped
    for i in range(3):
        assert f"│ {SLICE[:-1]}{i} │" in out  # whole, on one line
        assert f"sim-{i:02d}" in out
    assert max(len(line) for line in out.splitlines()) <= 80
    assert "column(s) fraction left out" in err
    words = " ".join(out.split())
    assert "│ NOT moved: node │" in out or "NOT moved:" in words  # the reason wraps in its column


def test_columns_are_left_out_from_the_right_before_an_id_is_cut(capsys, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    t = Table(title="3 lease(s)")
    for col in ("lease", "node", "department", "owner", "GPU", "slices", "endpoint", "expires in", "memory"):
        t.add_column(col)
    for i in range(3):
        t.add_row(f"lease-{i}a1b2c3d4e5f", "sim-01", "research", "someone.long@host.example.org", "3", "2",
                  "127.0.0.1:45123", "599 s", "1.5 GiB")
    dropped = print_table(t)
    out, err = capsys.readouterr()
    assert dropped == ["owner", "expires in", "memory"]
    assert "column(s) owner, expires in, memory left out to keep ids whole in 80 columns" in err
    for i in range(3):
        assert f"lease-{i}a1b2c3d4e5f" in out and "127.0.0.1:45123" in out
    assert max(len(line) for line in out.splitlines()) <= 80


def test_ids_wider_than_the_terminal_make_longer_lines_not_cut_ids(capsys, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    t = Table(title="t")
    t.add_column("id")
    t.add_column("slice")
    long_id = "x" * 50
    t.add_row(long_id, SLICE)
    print_table(t)
    out, _ = capsys.readouterr()
    assert long_id in out and SLICE in out
