"""Shuffle path planning: regret, path choices, delays (``delivery``) and hop attempts
(``shuffle``); the paper's Figs. 14-17.

Regret (paper §V) per (policy, graph, origin, dest), packets ordered by ``k``::

    R(K) = Σ_{k <= K} delay_ms(k) - K · optimal_ms

computed as the running sum of ``delay_ms - optimal_ms`` over the deliveries that carry
``optimal_ms``. The curve keeps at most about :data:`CURVE_POINTS` points per series
(every n-th packet, the first and the last), the summary has the exact final value. A
null ``graph`` is shown as ``""``.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from agiledart.analysis.columns import (
    Groups,
    Source,
    floats,
    groups,
    joined,
    ordered,
    partition,
    percentile,
)
from agiledart.analysis.model import Section, Table

__all__ = ["CDF_POINTS", "CURVE_POINTS", "OUTCOMES", "routing_section", "shuffle_section"]

CURVE_POINTS = 1000
CDF_POINTS = 101
TOP_PATHS = 20
OUTCOMES = ("ok", "lost", "late", "refused")
SERIES = ["policy", "graph", "origin", "dest"]


def _series(deliveries: pa.Table) -> Groups:
    return groups(*(deliveries[c] for c in SERIES))


def _regret(deliveries: pa.Table) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    delay, optimal = floats(deliveries["delay_ms"]), floats(deliveries["optimal_ms"])
    gap = delay - optimal
    series = _series(deliveries)
    total, scored_gaps = series.sum(gap)
    summary = [
        (*key, n, m, o, float(t) if g else None, w, a)
        for key, n, m, o, t, g, w, a in zip(
            series.keys,
            series.count().tolist(),
            series.mean(delay),
            series.mean(optimal),
            total.tolist(),
            scored_gaps.tolist(),
            series.count(np.isnan(optimal)).tolist(),
            series.mean(floats(deliveries["attempts"])),
            strict=True,
        )
    ]
    scored = deliveries.filter(pa.array(~np.isnan(optimal)))
    if not scored.num_rows:
        return [], ordered(summary, 0, 1, 2, 3)
    series = _series(scored)
    # each series' packets by k, then ts
    order = partition(series.ids, np.lexsort((floats(scored["ts"]), floats(scored["k"]))))
    ids = series.ids[order]
    gap = (floats(scored["delay_ms"]) - floats(scored["optimal_ms"]))[order]
    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    sizes = np.diff(np.r_[starts, len(ids)])
    packets = np.arange(len(ids)) - np.repeat(starts, sizes) + 1
    valid = ~np.isnan(gap)
    running = np.empty(len(ids))
    seen = np.empty(len(ids), dtype=np.int64)
    for start, size in zip(starts.tolist(), sizes.tolist(), strict=True):
        end = start + size  # the running sum of each series on its own, as SQL's window
        running[start:end] = np.cumsum(np.where(valid[start:end], gap[start:end], 0.0))
        seen[start:end] = np.cumsum(valid[start:end])
    n = np.repeat(sizes, sizes)
    step = np.maximum(1, np.ceil(n / CURVE_POINTS)).astype(np.int64)
    keep = (packets % step == 0) | (packets == 1) | (packets == n)
    picked = scored.take(pa.array(order[keep]))
    regret, counted = running[keep], seen[keep]
    curve = [
        (*series.keys[i], k, p, d, o, float(r) if c else None)
        for i, k, p, d, o, r, c in zip(
            ids[keep].tolist(),
            picked["k"].to_pylist(),
            packets[keep].tolist(),
            picked["delay_ms"].to_pylist(),
            picked["optimal_ms"].to_pylist(),
            regret.tolist(),
            counted.tolist(),
            strict=True,
        )
    ]
    return ordered(curve, 0, 1, 2, 3, 5), ordered(summary, 0, 1, 2, 3)


def _paths(deliveries: pa.Table) -> list[tuple[Any, ...]]:
    text = joined(deliveries["path"], " > ")
    counted = groups(*(deliveries[c] for c in SERIES), text)
    packets = counted.count().tolist()
    per_series: dict[tuple[Any, ...], list[tuple[Any, int]]] = defaultdict(list)
    for key, n in zip(counted.keys, packets, strict=True):
        per_series[key[:4]].append((key[4], n))
    rows = []
    for series, paths in per_series.items():
        total = sum(n for _, n in paths)
        ranked = ordered(paths, 1, 0, descending=(1,))
        for rank, (path, n) in enumerate(ranked[:TOP_PATHS], start=1):
            rows.append((*series, path, n, n / total, rank))
    return ordered(rows, 0, 1, 2, 3, 7)


def _cdf(deliveries: pa.Table) -> list[tuple[Any, ...]]:
    last = CDF_POINTS - 1
    by = groups(deliveries["policy"], deliveries["graph"])
    kept, offsets = by.sorted_values(floats(deliveries["delay_ms"]))
    rows = []
    for i, key in enumerate(by.keys):
        start, end = int(offsets[i]), int(offsets[i + 1])
        rows += [
            (*key, j / last, percentile(kept, start, end, j / last)) for j in range(CDF_POINTS)
        ]
    return ordered(rows, 0, 1, 2)


def routing_section(source: Source) -> Section:
    section = Section("routing", "Shuffle paths: regret, choices, delays", ("delivery",))
    if not source.has("delivery"):
        return section
    deliveries = source.table("delivery")
    deliveries = deliveries.set_column(
        deliveries.schema.get_field_index("graph"), "graph", pc.fill_null(deliveries["graph"], "")
    )
    curve, summary = _regret(deliveries)
    section.tables += [
        Table(
            "regret_summary",
            "Deliveries and final regret per series",
            [
                *SERIES,
                "packets",
                "delay_ms_mean",
                "optimal_ms",
                "regret_ms",
                "without_optimal",
                "attempts_mean",
            ],
            summary,
        ),
        Table(
            "regret",
            "Regret R(K) per policy and graph",
            [*SERIES, "k", "packets", "delay_ms", "optimal_ms", "regret_ms"],
            curve,
        ),
        Table(
            "paths",
            f"Most used paths (top {TOP_PATHS})",
            [*SERIES, "path", "packets", "share", "rank"],
            _paths(deliveries),
        ),
        Table(
            "delay_cdf",
            "Packet delay CDF per policy and graph",
            ["policy", "graph", "fraction", "delay_ms"],
            _cdf(deliveries),
        ),
    ]
    section.notes.append(
        "R(K) = Σ delay_ms(k) - K·optimal_ms over packets ordered by k, per (policy, "
        f"graph, origin, dest); curves keep about {CURVE_POINTS} points per series."
    )
    return section


_LINK_KEYS = ("policy", "graph", "hop", "node", "next", "outcome")


def _attempts(source: Source) -> list[dict[str, Any]]:
    """Hop attempts counted per policy, graph, hop, link and outcome, with their delay
    sums: a few hundred rows, from which every shuffle table adds up."""
    shuffles = source.table("shuffle")
    keys = [
        pc.fill_null(shuffles["graph"], "") if k == "graph" else shuffles[k] for k in _LINK_KEYS
    ]
    by = groups(*keys)
    delay_sum, delays = by.sum(floats(shuffles["delay_ms"]))
    return [
        {**dict(zip(_LINK_KEYS, key, strict=True)), "attempts": n, "delay_sum": s, "delays": d}
        for key, n, s, d in zip(
            by.keys, by.count().tolist(), delay_sum.tolist(), delays.tolist(), strict=True
        )
    ]


def _rolled(attempts: list[dict[str, Any]], keys: tuple[str, ...]) -> list[tuple[Any, ...]]:
    """The attempts added up per ``keys``: attempts, each outcome's, the success rate
    and the mean delay."""
    totals: dict[tuple[Any, ...], list[float]] = {}
    for a in attempts:
        t = totals.setdefault(tuple(a[k] for k in keys), [0, 0, 0, 0, 0, 0.0, 0])
        t[0] += a["attempts"]
        if a["outcome"] in OUTCOMES:
            t[1 + OUTCOMES.index(a["outcome"])] += a["attempts"]
        t[5] += a["delay_sum"]
        t[6] += a["delays"]
    return [
        (*key, int(n), *(int(x) for x in counts), counts[0] / n, _mean(s, d))
        for key, (n, *counts, s, d) in totals.items()
    ]


def _mean(total: float, n: float) -> float | None:
    return float(total / n) if n else None


def shuffle_section(source: Source) -> Section:
    section = Section("shuffle", "Shuffle hop attempts", ("shuffle",))
    if not source.has("shuffle"):
        return section
    attempts = _attempts(source)
    per_outcome: dict[tuple[Any, ...], list[float]] = {}
    for a in attempts:
        t = per_outcome.setdefault((a["policy"], a["graph"], a["outcome"]), [0, 0.0, 0])
        t[0] += a["attempts"]
        t[1] += a["delay_sum"]
        t[2] += a["delays"]
    outcomes = [(*key, int(n), _mean(s, d)) for key, (n, s, d) in per_outcome.items()]
    counts = ["attempts", *OUTCOMES, "success_rate", "delay_ms_mean"]
    section.tables += [
        Table(
            "shuffle_outcomes",
            "Attempts per outcome",
            ["policy", "graph", "outcome", "attempts", "delay_ms_mean"],
            ordered(outcomes, 0, 1, 2),
        ),
        Table(
            "shuffle_hops",
            "Attempts per hop index",
            ["policy", "graph", "hop", *counts],
            ordered(_rolled(attempts, ("policy", "graph", "hop")), 0, 1, 2),
        ),
        Table(
            "shuffle_links",
            "Attempts per link (node -> next)",
            ["policy", "graph", "node", "next", *counts],
            ordered(
                _rolled(attempts, ("policy", "graph", "node", "next")),
                0,
                1,
                4,
                2,
                3,
                descending=(4,),
            ),
        ),
    ]
    section.notes.append("One shuffle record per transmission attempt over one link.")
    return section
