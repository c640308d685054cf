"""The report's figures, drawn with matplotlib (Agg) from the tables, never from Spark.

Each function takes the :class:`~agiledart.analysis.model.Table` a figure shows and
returns a :class:`~agiledart.analysis.model.Plot` whose ``draw`` fills a figure. A
figure shows at most :data:`MAX_SERIES` series (the ones with most data), and a series
of more than :data:`MAX_POINTS` points is drawn through every n-th of them (the first
and the last kept: a figure is a few hundred pixels wide, and drawing a marker for
each of a hundred thousand events is most of a report's time); the CSV tables always
have every series and every row.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from agiledart.analysis.model import Plot, Section, Table

__all__ = [
    "MAX_POINTS",
    "MAX_SERIES",
    "checkpoints",
    "delay_cdf",
    "latency",
    "normal_probability",
    "of_section",
    "operators_per_peer",
    "outcomes",
    "path_shares",
    "peer_events",
    "recovery",
    "regret",
    "scaling",
    "schedulers",
    "throughput",
]

MAX_SERIES = 8
MAX_POINTS = 2000

Rows = list[dict[str, Any]]


def _series(table: Table, keys: Sequence[str]) -> list[tuple[str, Rows]]:
    """Rows grouped by ``keys``, largest groups first, at most :data:`MAX_SERIES`."""
    groups: dict[tuple[Any, ...], Rows] = {}
    for row in table.records():
        groups.setdefault(tuple(row[k] for k in keys), []).append(row)
    ranked = sorted(groups.items(), key=lambda kv: (-len(kv[1]), str(kv[0])))[:MAX_SERIES]
    return sorted(((" ".join(str(k) for k in key if k != ""), rows) for key, rows in ranked))


def _thinned(rows: Sequence[Any]) -> Sequence[Any]:
    """At most about :data:`MAX_POINTS` of ``rows``, evenly spaced, the last included."""
    step = -(-len(rows) // MAX_POINTS)
    if step <= 1:
        return rows
    return [*rows[::step], *([rows[-1]] if (len(rows) - 1) % step else [])]


def _xy(rows: Rows, x: str, y: str) -> tuple[list[float], list[float]]:
    kept = _thinned([(r[x], r[y]) for r in rows if r[x] is not None and r[y] is not None])
    return [float(a) for a, _ in kept], [float(b) for _, b in kept]


def _axes(fig: Figure, title: str, xlabel: str, ylabel: str) -> Axes:
    ax = fig.add_subplot()
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    return ax


def _legend(ax: Axes) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small")


def _plot(
    name: str, caption: str, size: tuple[float, float] = (8.0, 4.5)
) -> Callable[[Callable[[Figure], None]], Plot]:
    def wrap(draw: Callable[[Figure], None]) -> Plot:
        return Plot(name=name, caption=caption, draw=draw, size=size)

    return wrap


def latency(windows: Table) -> Plot:
    @_plot("latency", "Latency percentiles per app over time")
    def draw(fig: Figure) -> None:
        ax = _axes(fig, "End-to-end latency", "time (s)", "latency (ms)")
        for label, rows in _series(windows, ["app"]):
            for q, style in (("p50_ms", "-"), ("p95_ms", "--"), ("p99_ms", ":")):
                ax.plot(*_xy(rows, "t_s", q), style, label=f"{label} {q[:-3]}")
        _legend(ax)

    return draw


def _lines(
    table: Table,
    plot: tuple[str, str],
    labels: tuple[str, str, str],
    keys: Sequence[str],
    x: str,
    y: str,
    *,
    style: str = "-",
    size: tuple[float, float] = (8.0, 4.5),
) -> Plot:
    """One line per group of ``keys`` (``plot``: name and caption; ``labels``: title,
    x label, y label)."""

    @_plot(*plot, size)
    def draw(fig: Figure) -> None:
        ax = _axes(fig, *labels)
        for label, rows in _series(table, keys):
            ax.plot(*_xy(rows, x, y), style, label=label)
        if x == "rank":
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # ranks are whole numbers
        _legend(ax)

    return draw


def throughput(windows: Table) -> Plot:
    return _lines(
        windows,
        ("throughput", "Records out per second per operator"),
        ("Operator throughput", "time (s)", "records/s"),
        ["app", "operator"],
        "t_s",
        "out_per_s",
    )


def regret(curve: Table) -> Plot:
    return _lines(
        curve,
        ("regret", "Cumulative regret R(K) per policy (Figs. 14-16)"),
        ("Regret", "packets K", "R(K) (ms)"),
        ["policy", "graph", "origin", "dest"],
        "packets",
        "regret_ms",
    )


def path_shares(paths: Table) -> Plot:
    return _lines(
        paths,
        ("paths", "Share of packets on each policy's most used paths"),
        ("Path selection", "path rank", "share of packets"),
        ["policy", "graph", "origin", "dest"],
        "rank",
        "share",
        style="o-",
        size=(8.0, 5.0),
    )


def delay_cdf(cdf: Table) -> Plot:
    return _lines(
        cdf,
        ("delay_cdf", "Packet delay CDF per policy (Fig. 17)"),
        ("Packet delay", "delay (ms)", "fraction of packets"),
        ["policy", "graph"],
        "delay_ms",
        "fraction",
    )


def outcomes(by_outcome: Table) -> Plot:
    @_plot("shuffle_outcomes", "Hop attempts per outcome and policy")
    def draw(fig: Figure) -> None:
        ax = _axes(fig, "Shuffle attempts", "policy / graph", "attempts")
        groups = _series(by_outcome, ["policy", "graph"])
        names = sorted({str(r["outcome"]) for _, rows in groups for r in rows})
        bottom = [0.0] * len(groups)
        for outcome in names:
            heights = [
                float(sum(r["attempts"] for r in rows if r["outcome"] == outcome))
                for _, rows in groups
            ]
            ax.bar(range(len(groups)), heights, bottom=bottom, label=outcome)
            bottom = [a + b for a, b in zip(bottom, heights, strict=True)]
        ax.set_xticks(range(len(groups)), [label for label, _ in groups], rotation=15)
        _legend(ax)

    return draw


def operators_per_peer(histogram: Table) -> Plot:
    @_plot("operators_per_peer", "Peers by number of operator instances (Fig. 10)")
    def draw(fig: Figure) -> None:
        ax = _axes(fig, "Operators per peer", "operator instances on a peer", "peers")
        ax.bar(histogram.column("operators"), histogram.column("peers"))

    return draw


def normal_quantiles(n: int) -> list[float]:
    """Standard normal quantiles at Blom's positions (i - 3/8) / (n + 1/4), i = 1..n."""
    unit = statistics.NormalDist()
    return [unit.inv_cdf((i - 0.375) / (n + 0.25)) for i in range(1, n + 1)]


def normal_probability(per_peer: Table) -> Plot:
    @_plot("operators_normal_probability", "Normal probability plot of operators per peer")
    def draw(fig: Figure) -> None:
        ax = _axes(fig, "Normal probability plot", "standard normal quantile", "operators")
        counts = sorted(float(c) for c in per_peer.column("operators"))
        z = normal_quantiles(len(counts))
        ax.plot(z, counts, "o")
        if len(counts) > 1 and statistics.pstdev(counts) > 0:
            mean, sd = statistics.fmean(counts), statistics.stdev(counts)
            ax.plot([z[0], z[-1]], [mean + sd * z[0], mean + sd * z[-1]], "--")

    return draw


def schedulers(per_zone: Table) -> Plot:
    @_plot("schedulers", "Zone schedulers per zone")
    def draw(fig: Figure) -> None:
        ax = _axes(fig, "Schedulers per zone", "zone", "distinct schedulers")
        zones = [str(z) for z in per_zone.column("zone")]
        ax.bar(zones, per_zone.column("schedulers"))

    return draw


def scaling(timeline: Table) -> Plot:
    groups = _series(timeline, ["app", "operator"])

    @_plot("scaling", "Health score and instances over time (Fig. 12)", (8.0, 2.5 * len(groups)))
    def draw(fig: Figure) -> None:
        axes = fig.subplots(len(groups), 1, squeeze=False)[:, 0]
        for ax, (label, rows) in zip(axes, groups, strict=True):
            ax.set_title(label, fontsize="medium")
            ax.plot(*_xy(rows, "t_s", "health"), "o-", color="tab:blue")
            ax.set_ylabel("health", color="tab:blue")
            ax.set_ylim(0, 1.05)
            twin = ax.twinx()
            twin.step(*_xy(rows, "t_s", "instances"), where="post", color="tab:orange")
            twin.set_ylabel("instances", color="tab:orange")
            ax.grid(True, alpha=0.3)
        axes[-1].set_xlabel("time (s)")
        fig.tight_layout()

    return draw


def recovery(incidents: Table) -> Plot:
    rows = incidents.records()

    @_plot("recovery", "Recovery timeline: detected to resumed (Fig. 11)")
    def draw(fig: Figure) -> None:
        ax = _axes(fig, "Recovery", "time (s)", "")
        for y, row in enumerate(rows):
            start = row["detected_s"]
            end = row["resumed_s"] if row["resumed_s"] is not None else row["restored_s"]
            if start is not None and end is not None:
                ax.barh(y, end - start, left=start, color="tab:red", alpha=0.6)
            for phase, marker in (("detected", "v"), ("restored", "s"), ("resumed", "^")):
                if row[f"{phase}_s"] is not None:
                    ax.plot([row[f"{phase}_s"]], [y], marker, color="black")
        ax.set_yticks(range(len(rows)), [f"{r['app']} / {r['dead_peer']}" for r in rows])

    return draw


def checkpoints(log: Table) -> Plot:
    @_plot("checkpoints", "Checkpoint duration over time")
    def draw(fig: Figure) -> None:
        ax = _axes(fig, "Checkpoints", "time (s)", "duration (ms)")
        for label, rows in _series(log, ["app"]):
            ax.plot(*_xy(rows, "t_s", "duration_ms"), "o-", label=label)
        _legend(ax)

    return draw


def peer_events(log: Table) -> Plot:
    @_plot("peer_events", "Membership events over time")
    def draw(fig: Figure) -> None:
        ax = _axes(fig, "Membership", "time (s)", "subject")
        records = log.records()
        kinds = sorted({str(r["event"]) for r in records})
        for kind in kinds:
            rows = _thinned([r for r in records if str(r["event"]) == kind])
            ax.plot(
                _floats(r["t_s"] for r in rows), [str(r["subject"]) for r in rows], "o", label=kind
            )
        _legend(ax)

    return draw


def _floats(values: Iterable[Any]) -> list[float]:
    return [float(v) for v in values]


def of_section(section: Section) -> list[Plot]:
    """The figures of a section, drawn from its tables."""
    table = {t.name: t for t in section.tables}
    if section.empty:
        return []
    if section.key == "latency":
        return [latency(table["latency_windows"])]
    if section.key == "throughput":
        return [throughput(table["throughput_windows"])]
    if section.key == "routing":
        curve = [regret(table["regret"])] if table["regret"].rows else []
        return [*curve, path_shares(table["paths"]), delay_cdf(table["delay_cdf"])]
    if section.key == "shuffle":
        return [outcomes(table["shuffle_outcomes"])]
    if section.key == "placement":
        return [
            operators_per_peer(table["operators_per_peer_hist"]),
            normal_probability(table["operators_per_peer"]),
        ]
    if section.key == "schedulers":
        return [schedulers(table["schedulers"])]
    if section.key == "scaling":
        return [scaling(table["scaling"])]
    if section.key == "recovery":
        return [recovery(table["recovery_incidents"])]
    if section.key == "checkpoints":
        return [checkpoints(table["checkpoints"])]
    if section.key == "peers":
        return [peer_events(table["peer_events"])]
    return []
