"""What an analysis produces: sections of tables and plots, before they become files.

The Spark jobs (:mod:`~agiledart.analysis.metrics`, :mod:`~agiledart.analysis.routing`,
:mod:`~agiledart.analysis.placement`, :mod:`~agiledart.analysis.timelines`) each
return a :class:`Section`; :mod:`~agiledart.analysis.report` writes its tables as CSV,
draws its plots as PNG and lays it out in ``report.html``. Tables are small by
construction (aggregates, downsampled curves), so they are collected to the driver.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from matplotlib.figure import Figure
from pyspark.sql import DataFrame

__all__ = ["Plot", "Section", "Table", "collect"]


@dataclass(frozen=True)
class Table:
    """One CSV file, ``tables/<name>.csv``."""

    name: str
    title: str
    columns: list[str]
    rows: list[tuple[Any, ...]]

    def column(self, name: str) -> list[Any]:
        i = self.columns.index(name)
        return [row[i] for row in self.rows]

    def records(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, row, strict=True)) for row in self.rows]


@dataclass(frozen=True)
class Plot:
    """One PNG file, ``plots/<name>.png``, drawn by ``draw`` on an empty figure."""

    name: str
    caption: str
    draw: Callable[[Figure], None]
    size: tuple[float, float] = (8.0, 4.5)


@dataclass
class Section:
    """One part of the report, about one or a few record types."""

    key: str
    title: str
    record_types: tuple[str, ...]
    notes: list[str] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    plots: list[Plot] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.tables and not self.plots


def collect(frame: DataFrame, name: str, title: str) -> Table:
    """Run ``frame`` and keep its rows as a :class:`Table` (through Arrow: a log table
    of every record of a type can have hundreds of thousands of rows, which Spark's
    row-by-row pickling brings over several times slower)."""
    columns = [column.to_pylist() for column in frame.toArrow().columns]
    rows = list(zip(*columns, strict=True)) if columns else []
    return Table(name=name, title=title, columns=list(frame.columns), rows=rows)
