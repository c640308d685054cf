"""Timelines: scaling (``scaling``, the paper's Fig. 12), recovery (``recovery``,
Fig. 11), checkpoints (``checkpoint``) and membership (``peer``).

Times are seconds since the trace's first record. A recovery incident is one
(app, dead peer): when it was detected, restored and resumed (the first record of each
phase), and the durations the peers measured.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from agiledart.analysis.columns import Source, floats, groups, joined, ordered, sorted_rows
from agiledart.analysis.model import Section, Table

__all__ = ["checkpoint_section", "peer_section", "recovery_section", "scaling_section"]

PHASES = ("detected", "restored", "resumed")
DECISIONS = ("up", "down", "hold", "scale-out", "migrate")


def _timed(source: Source, kind: str, *columns: str) -> pa.Table:
    """``t_s`` (seconds since the trace's start) and ``columns`` of the ``kind`` records."""
    records = source.table(kind)
    return records.select(list(columns)).add_column(0, "t_s", [source.seconds(records["ts"])])


def _is(column: pa.ChunkedArray, value: str) -> np.ndarray:
    return np.asarray(pc.fill_null(pc.equal(column, value), False).to_numpy(), dtype=bool)


def scaling_section(source: Source) -> Section:
    section = Section("scaling", "Scaling", ("scaling",))
    if not source.has("scaling"):
        return section
    columns = ("app", "operator", "peer", "health", "instances", "target", "decision")
    decisions = _timed(source, "scaling", *columns)
    by = groups(decisions["app"], decisions["operator"])
    ts = floats(decisions["t_s"])
    instances = floats(decisions["instances"])
    health = floats(decisions["health"])
    per_decision = [by.count(_is(decisions["decision"], d)).tolist() for d in DECISIONS]
    summary = [
        (*key, n, *(c[i] for c in per_decision), _int(low), _int(high), last, mean, latest)
        for i, (key, n, low, high, last, mean, latest) in enumerate(
            zip(
                by.keys,
                by.count().tolist(),
                by.extreme(instances, np.minimum),
                by.extreme(instances, np.maximum),
                by.last(decisions["instances"], ts),
                by.mean(health),
                by.last(decisions["health"], ts),
                strict=True,
            )
        )
    ]
    section.tables += [
        Table(
            "scaling_summary",
            "Scaling per operator",
            [
                "app",
                "operator",
                "decisions",
                *DECISIONS,
                "instances_min",
                "instances_max",
                "instances_last",
                "health_mean",
                "health_last",
            ],
            ordered(summary, 0, 1),
        ),
        Table(
            "scaling",
            "Scaling decisions (health and instances over time)",
            ["t_s", *columns],
            sorted_rows(decisions, "app", "operator", "t_s"),
        ),
    ]
    return section


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def recovery_section(source: Source) -> Section:
    section = Section("recovery", "Failure recovery", ("recovery",))
    if not source.has("recovery"):
        return section
    columns = ("app", "dead_peer", "epoch", "phase", "duration_ms")
    events = _timed(source, "recovery", *columns, "operators")
    at = events.schema.get_field_index("operators")
    events = events.set_column(at, "operators", joined(events["operators"], " "))
    by = groups(events["app"], events["dead_peer"])
    t_s, took = floats(events["t_s"]), floats(events["duration_ms"])
    first = {
        p: by.extreme(np.where(_is(events["phase"], p), t_s, np.nan), np.minimum) for p in PHASES
    }
    longest = {
        p: by.extreme(np.where(_is(events["phase"], p), took, np.nan), np.maximum)
        for p in PHASES[1:]
    }
    epochs = by.extreme(floats(events["epoch"]), np.maximum)
    incidents = []
    for i, key in enumerate(by.keys):
        detected, resumed = first["detected"][i], first["resumed"][i]
        incidents.append(
            (
                *key,
                *(first[p][i] for p in PHASES),
                *(longest[p][i] for p in PHASES[1:]),
                _int(epochs[i]),
                None if detected is None or resumed is None else resumed - detected,
            )
        )
    section.tables += [
        Table(
            "recovery_incidents",
            "Recovery incidents (one per app and dead peer)",
            [
                "app",
                "dead_peer",
                *(f"{p}_s" for p in PHASES),
                *(f"{p}_ms" for p in PHASES[1:]),
                "epoch",
                "detect_to_resume_s",
            ],
            ordered(incidents, 2, 0, 1),
        ),
        Table(
            "recovery_events",
            "Recovery events",
            ["t_s", *columns, "operators"],
            sorted_rows(events, "t_s", "app"),
        ),
    ]
    return section


def checkpoint_section(source: Source) -> Section:
    section = Section("checkpoints", "Checkpoints", ("checkpoint",))
    if not source.has("checkpoint"):
        return section
    columns = ("app", "peer", "epoch", "bytes", "duration_ms", "m", "k", "committed")
    checkpoints = _timed(source, "checkpoint", *columns)
    by = groups(checkpoints["app"])
    committed = np.asarray(pc.fill_null(checkpoints["committed"], False).to_numpy(), dtype=bool)
    took = floats(checkpoints["duration_ms"])
    summary = [
        (*key, n, c, _int(last), size, mean, longest)
        for key, n, c, last, size, mean, longest in zip(
            by.keys,
            by.count().tolist(),
            by.count(committed).tolist(),
            by.extreme(floats(checkpoints["epoch"]), np.maximum),
            by.mean(floats(checkpoints["bytes"])),
            by.mean(took),
            by.extreme(took, np.maximum),
            strict=True,
        )
    ]
    section.tables += [
        Table(
            "checkpoint_summary",
            "Checkpoints per app",
            [
                "app",
                "checkpoints",
                "committed",
                "last_epoch",
                "bytes_mean",
                "duration_ms_mean",
                "duration_ms_max",
            ],
            ordered(summary, 0),
        ),
        Table(
            "checkpoints", "Checkpoints", ["t_s", *columns], sorted_rows(checkpoints, "t_s", "app")
        ),
    ]
    return section


def peer_section(source: Source) -> Section:
    section = Section("peers", "Membership", ("peer",))
    if not source.has("peer"):
        return section
    events = _timed(source, "peer", "peer", "event", "subject", "zone")
    by = groups(events["event"])
    counts = [(*key, n) for key, n in zip(by.keys, by.count().tolist(), strict=True)]
    section.tables += [
        Table("peer_event_counts", "Membership events", ["event", "records"], ordered(counts, 0)),
        Table(
            "peer_events",
            "Membership events (who saw what)",
            ["t_s", "peer", "event", "subject", "zone"],
            sorted_rows(events, "t_s", "peer"),
        ),
    ]
    return section
