"""The report's CSV files from hand-made tables (no Spark): every value written the
same way whichever way the table is written (a NaN anywhere, or none)."""

from __future__ import annotations

import csv
import io
import math

from agiledart.analysis.model import Table
from agiledart.analysis.report import csv_text

COLUMNS = ["t_s", "app", "health", "instances", "ok", "note"]
ROWS = [
    (0.1, "a", 1e-07, 3, True, None),
    (1e16, "b,c", 0.30000000000000004, None, False, 'say "hi"'),
    (2.0, "", float("inf"), -1, None, "line\nbreak"),
]


def _read(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text, newline="")))


def test_a_table_without_nan_writes_each_value_as_a_cell() -> None:
    rows = _read(csv_text(Table("t", "t", COLUMNS, ROWS)))
    assert rows[0] == COLUMNS
    assert rows[1] == ["0.1", "a", "1e-07", "3", "True", ""]
    assert rows[2] == ["1e+16", "b,c", "0.30000000000000004", "", "False", 'say "hi"']
    assert rows[3] == ["2.0", "", "inf", "-1", "", "line\nbreak"]
    assert [float(r[2]) for r in rows[1:]] == [1e-07, 0.30000000000000004, math.inf]


def test_a_nan_is_an_empty_cell_and_the_other_values_are_unchanged() -> None:
    with_nan = [*ROWS, (float("nan"), "d", float("nan"), 4, True, "x")]
    rows = _read(csv_text(Table("t", "t", COLUMNS, with_nan)))
    assert rows[1:4] == _read(csv_text(Table("t", "t", COLUMNS, ROWS)))[1:]
    assert rows[4] == ["", "d", "", "4", "True", "x"]
