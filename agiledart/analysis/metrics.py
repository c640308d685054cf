"""Latency per app (``tuple`` records) and throughput per operator (``opstats``).

Time is cut into windows of ``window_ms`` from the trace's first record
(:attr:`Source.t0_ms`): window ``w`` holds the records with
``w = floor((ts - t0) / window_ms)`` and starts ``w * window_ms / 1000`` seconds into
the trace. Percentiles are exact (linear interpolation between the closest ranks,
numpy's default ``method="linear"``; :func:`~agiledart.analysis.columns.percentile`).

``opstats`` counters are cumulative per operator instance (``app``, ``operator``,
``peer``); an operator's throughput in a window is the sum over its instances of the
counter increase since each instance's previous sample, divided by the window length.
An instance's first sample has no previous one and adds nothing; a counter that went
down (the instance restarted) adds its new value.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from agiledart.analysis.columns import (
    Groups,
    Source,
    floats,
    groups,
    ordered,
    partition,
    percentile,
)
from agiledart.analysis.model import Section, Table

__all__ = ["PERCENTILES", "latency_section", "throughput_section"]

PERCENTILES = (0.5, 0.95, 0.99)
_LATENCY = ["count", *(f"p{round(q * 100)}_ms" for q in PERCENTILES), "mean_ms", "max_ms"]


def _latency(by: Groups, values: np.ndarray) -> list[tuple[Any, ...]]:
    """Per group: rows, the percentiles, mean and largest of the non-null values."""
    counts = by.count().tolist()
    means = by.mean(values)
    kept, offsets = by.sorted_values(values)
    out = []
    for i in range(by.n):
        start, end = int(offsets[i]), int(offsets[i + 1])
        spread = [percentile(kept, start, end, q) for q in PERCENTILES]
        largest = float(kept[end - 1]) if end > start else None
        out.append((counts[i], *spread, means[i], largest))
    return out


def latency_section(source: Source) -> Section:
    section = Section("latency", "End-to-end latency", ("tuple",))
    if not source.has("tuple"):
        return section
    tuples = source.table("tuple")
    latency = floats(tuples["latency_ms"])
    seconds = source.window_ms / 1000.0
    by_window = groups(tuples["app"], source.windows(tuples["ts"]))
    windows = [
        (app, window, window * seconds, *stats)
        for (app, window), stats in zip(by_window.keys, _latency(by_window, latency), strict=True)
    ]
    by_sink = groups(tuples["app"], tuples["sink"])
    summary = [
        (*key, *stats) for key, stats in zip(by_sink.keys, _latency(by_sink, latency), strict=True)
    ]
    section.tables += [
        Table(
            "latency_summary",
            "Latency per app and sink",
            ["app", "sink", *_LATENCY],
            ordered(summary, 0, 1),
        ),
        Table(
            "latency_windows",
            f"Latency per app per {source.window_ms:g} ms window",
            ["app", "window", "t_s", *_LATENCY],
            ordered(windows, 0, 1),
        ),
    ]
    section.notes.append(
        f"Sampled tuples at their sinks; windows of {source.window_ms:g} ms from the trace's "
        "start; exact percentiles (linear interpolation)."
    )
    return section


def _increase(counter: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Each sample's counter increase since its instance's previous one (the rows are
    grouped by instance in time order; ``first`` marks each instance's first sample)."""
    before = np.r_[np.nan, counter[:-1]]
    before[first] = np.nan
    with np.errstate(invalid="ignore"):
        grown = counter >= before
    return np.where(grown, counter - before, np.where(np.isnan(before), np.nan, counter))


def _distinct(by: Groups, values: pa.ChunkedArray) -> list[int]:
    """Per group, how many distinct non-null values."""
    valid = np.asarray(values.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    pairs = groups(by.ids[valid], values.filter(pa.array(valid)))
    counts: list[int] = np.bincount(
        np.array([k[0] for k in pairs.keys], dtype=np.int64), minlength=by.n
    ).tolist()
    return counts


def throughput_section(source: Source) -> Section:
    section = Section("throughput", "Operator throughput", ("opstats",))
    if not source.has("opstats"):
        return section
    samples = source.table("opstats")
    instance = groups(samples["app"], samples["operator"], samples["peer"])
    order = partition(instance.ids, np.argsort(floats(samples["ts"]), kind="stable"))
    samples = samples.take(pa.array(order))
    ids = instance.ids[order]
    instance = Groups(ids=ids, keys=instance.keys)  # the same groups, rows in time order
    first = np.r_[True, ids[1:] != ids[:-1]]
    d_in = _increase(floats(samples["records_in"]), first)
    d_out = _increase(floats(samples["records_out"]), first)

    seconds = source.window_ms / 1000.0
    per_window = groups(samples["app"], samples["operator"], source.windows(samples["ts"]))
    ins, _ = per_window.sum(d_in)
    outs, _ = per_window.sum(d_out)
    peers = _distinct(per_window, samples["peer"])
    queue = per_window.mean(floats(samples["queue"]))
    utilization = per_window.mean(floats(samples["utilization"]))
    windows = [
        (app, op, w, w * seconds, float(i / seconds), float(o / seconds), n, q, u)
        for (app, op, w), i, o, n, q, u in zip(
            per_window.keys, ins.tolist(), outs.tolist(), peers, queue, utilization, strict=True
        )
    ]
    section.tables += [
        Table(
            "throughput_summary",
            "Throughput per operator",
            [
                "app",
                "operator",
                "instances",
                "records_in",
                "records_out",
                "out_per_s_mean",
                "out_per_s_max",
                "queue_max",
                "utilization_mean",
            ],
            _per_operator(samples, instance, windows),
        ),
        Table(
            "throughput_windows",
            f"Throughput per {source.window_ms:g} ms window",
            [
                "app",
                "operator",
                "window",
                "t_s",
                "in_per_s",
                "out_per_s",
                "instances",
                "queue_mean",
                "utilization_mean",
            ],
            ordered(windows, 0, 1, 2),
        ),
    ]
    section.notes.append(
        "Records out per second per operator, summed over its instances (counter "
        "increases between an instance's samples)."
    )
    return section


def _per_operator(
    samples: pa.Table, instance: Groups, windows: list[tuple[Any, ...]]
) -> list[tuple[Any, ...]]:
    """Counter totals (each instance's largest value, summed) and the window rates."""
    last_in = instance.extreme(floats(samples["records_in"]), np.maximum)
    last_out = instance.extreme(floats(samples["records_out"]), np.maximum)
    totals: dict[tuple[Any, Any], list[int]] = {}
    for (app, op, _), i, o in zip(instance.keys, last_in, last_out, strict=True):
        total = totals.setdefault((app, op), [0, 0, 0])
        total[0] += 1
        total[1] += int(i)
        total[2] += int(o)
    rates: dict[tuple[Any, Any], list[list[float]]] = {}
    for app, op, _, _, _, out, _, queue, utilization in windows:
        rate = rates.setdefault((app, op), [[], [], []])
        rate[0].append(out)
        if queue is not None:
            rate[1].append(queue)
        if utilization is not None:
            rate[2].append(utilization)
    rows = []
    for key, (n, records_in, records_out) in totals.items():
        out, queue, utilization = rates[key]
        rows.append(
            (
                *key,
                n,
                records_in,
                records_out,
                sum(out) / len(out),
                max(out),
                max(queue) if queue else None,
                sum(utilization) / len(utilization) if utilization else None,
            )
        )
    return ordered(rows, 0, 1)
