"""What an analysis produces: sections of tables and plots, before they become files.

The sections' Spark queries (:mod:`~agiledart.analysis.metrics`,
:mod:`~agiledart.analysis.routing`, :mod:`~agiledart.analysis.placement`,
:mod:`~agiledart.analysis.timelines`) each make a :class:`Section` of the final tables
they bring back to the driver, which adds the plots
(:func:`~agiledart.analysis.plots.of_section`); :mod:`~agiledart.analysis.report`
writes its tables as CSV, draws its plots as PNG and lays it out in ``report.html``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["Plot", "Section", "Table"]


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
