"""File connectors' parsing: JSONL and CSV lines to records, bad lines counted.

Every record needs an integer ``ts`` (event time, ms; an integral float such as
``1000.0`` is accepted and made an int). A line that cannot become a record - invalid
JSON, not an object, bad UTF-8, a wrong number of CSV fields, no ``ts``, longer than
:data:`MAX_LINE` bytes - is skipped and recorded as a
:class:`~agiledart.app.errors.ParseError` (line number and reason) in the
:class:`ParseStats` passed in; reading never stops on bad data. CSV files start with a
header line; numeric fields become ``int`` or ``float``, empty fields ``None``, the rest
stay strings.
"""

from __future__ import annotations

import csv
import json
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from agiledart.app.errors import DataError, ParseError

__all__ = ["MAX_LINE", "ParseStats", "parse_csv", "parse_jsonl", "read_file"]

Record = dict[str, Any]
MAX_LINE = 1 << 20
_KEEP_ERRORS = 100
_INT = re.compile(r"^[+-]?\d+$")
_FLOAT = re.compile(r"^[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?$")


@dataclass(slots=True)
class ParseStats:
    """Counts of one read; ``errors`` keeps the first 100 bad lines."""

    lines: int = 0
    records: int = 0
    bad: int = 0
    errors: list[ParseError] = field(default_factory=list)

    def add(self, error: ParseError) -> None:
        self.bad += 1
        if len(self.errors) < _KEEP_ERRORS:
            self.errors.append(error)


def _lines(lines: Iterable[str | bytes], stats: ParseStats) -> Iterator[tuple[int, str]]:
    """Decoded, non-blank lines with their 1-based numbers; bad ones recorded."""
    for n, line in enumerate(lines, start=1):
        stats.lines += 1
        if len(line) > MAX_LINE:
            stats.add(ParseError(n, f"line longer than {MAX_LINE} bytes"))
            continue
        if isinstance(line, bytes):
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError as e:
                stats.add(ParseError(n, f"not UTF-8: {e.reason} at byte {e.start}"))
                continue
        else:
            text = line
        text = text.rstrip("\r\n")
        if text.strip():
            yield n, text


def _with_ts(n: int, rec: Record, stats: ParseStats) -> Record | None:
    ts = rec.get("ts")
    if isinstance(ts, float) and ts.is_integer():
        rec["ts"] = int(ts)
    elif not isinstance(ts, int) or isinstance(ts, bool):
        what = "no 'ts' field" if ts is None else f"'ts' is {ts!r}"
        stats.add(ParseError(n, f"{what}; records need an integer event time 'ts' in ms"))
        return None
    stats.records += 1
    return rec


def parse_jsonl(lines: Iterable[str | bytes], stats: ParseStats | None = None) -> Iterator[Record]:
    """Records from JSON-object lines; blank lines are skipped silently."""
    st = stats if stats is not None else ParseStats()
    for n, text in _lines(lines, st):
        try:
            obj = json.loads(text)
        except ValueError as e:
            st.add(ParseError(n, f"not valid JSON: {e}"))
            continue
        if not isinstance(obj, dict):
            st.add(ParseError(n, f"not a JSON object but {type(obj).__name__}"))
            continue
        rec = _with_ts(n, obj, st)
        if rec is not None:
            yield rec


def _convert(value: str) -> Any:
    if value == "":
        return None
    if _INT.match(value):
        return int(value)
    if _FLOAT.match(value):
        return float(value)
    return value


def parse_csv(lines: Iterable[str | bytes], stats: ParseStats | None = None) -> Iterator[Record]:
    """Records from CSV lines; the first non-blank line is the header."""
    st = stats if stats is not None else ParseStats()
    numbered = _lines(lines, st)
    header: list[str] | None = None
    for n, text in numbered:
        try:
            rows = list(csv.reader([text]))
        except csv.Error as e:
            st.add(ParseError(n, f"bad CSV: {e}"))
            continue
        row = rows[0] if rows else []
        if header is None:
            names = [h.strip() for h in row]
            if not names or any(not h for h in names) or len(set(names)) != len(names):
                st.add(ParseError(n, f"bad CSV header {row!r}: need unique, non-empty names"))
                for m, _ in numbered:
                    st.add(ParseError(m, "skipped: the file has no usable header"))
                return
            header = names
            continue
        if len(row) != len(header):
            st.add(ParseError(n, f"{len(row)} fields, the header has {len(header)}"))
            continue
        rec = _with_ts(n, {h: _convert(v) for h, v in zip(header, row, strict=True)}, st)
        if rec is not None:
            yield rec


def read_file(
    path: str | os.PathLike[str], fmt: str, stats: ParseStats | None = None
) -> Iterator[Record]:
    """Records of a ``jsonl`` or ``csv`` file (one record per line)."""
    parsers = {"jsonl": parse_jsonl, "csv": parse_csv}
    if fmt not in parsers:
        msg = f"unknown file format {fmt!r}; use jsonl or csv"
        raise DataError(msg)
    parse = parsers[fmt]
    with open(path, "rb") as f:
        yield from parse(f, stats)
