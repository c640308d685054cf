"""The report's figures drawn from hand-made tables (no Spark): axes that count
things have whole-number ticks."""

from __future__ import annotations

from matplotlib.figure import Figure

from agiledart.analysis.model import Table
from agiledart.analysis.plots import path_shares


def test_the_path_plots_rank_axis_has_integer_ticks() -> None:
    columns = ["policy", "graph", "origin", "dest", "rank", "share"]
    rows = [
        ("kl-ucb", "g1", "a", "b", rank, share) for rank, share in ((1, 0.6), (2, 0.3), (3, 0.1))
    ] + [("random", "g1", "a", "b", rank, 0.5) for rank in (1, 2)]
    plot = path_shares(Table("paths", "paths", columns, rows))
    fig = Figure(figsize=plot.size)
    plot.draw(fig)
    (ax,) = fig.axes
    fig.canvas.draw()  # ticks as rendered
    ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
    assert len(ticks) >= 2
    assert all(float(t).is_integer() for t in ticks), ticks
    labels = [label.get_text() for label in ax.get_xticklabels() if label.get_text()]
    assert labels
    assert all("." not in text for text in labels), labels
