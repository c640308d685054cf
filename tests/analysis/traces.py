"""Plain-Python readers of trace files, to check Spark's figures against."""

from __future__ import annotations

import csv
import gzip
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agiledart.traces import TraceSchemaError, check, trace_files

__all__ = ["close", "percentile_fits", "read_csv", "records", "valid_records"]


def _lines(path: Path) -> Iterator[str]:
    if path.name.endswith(".gz"):
        with gzip.open(path, "rt") as fh:
            try:
                yield from fh
            except EOFError:  # a gzip file cut short: what was written before the cut
                return
    else:
        with path.open() as fh:
            yield from fh


def records(directory: Path) -> list[dict[str, Any]]:
    """Every line of every trace file that parses as a JSON object."""
    out = []
    for path in trace_files(directory):
        for line in _lines(path):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                out.append(value)
    return out


def valid_records(directory: Path) -> list[dict[str, Any]]:
    """The records the schema accepts."""
    out = []
    for record in records(directory):
        try:
            check(record)
        except TraceSchemaError:
            continue
        if record["v"] == 1:
            out.append(record)
    return out


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-6)


def percentile_fits(shown: str | float | None, values: list[float], q: float) -> bool:
    """Whether ``shown`` is the ``q``-quantile of ``values`` as the analysis states it:
    withheld (empty) below ``MIN_SAMPLES`` values, else within a relative ``ALPHA``
    (and a float's rounding) of the value of rank ``max(1, ceil(q * n))``."""
    from agiledart.analysis.sketch import ALPHA, MIN_SAMPLES, rank

    n = len(values)
    if n < MIN_SAMPLES:
        return shown in ("", None)
    if shown in ("", None):
        return False
    got = float(shown)  # type: ignore[arg-type]
    exact = sorted(values)[rank(q, n) - 1]
    return abs(got - exact) <= ALPHA * abs(exact) * (1 + 1e-9) + 1e-9
