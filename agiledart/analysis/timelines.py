"""Timelines: scaling (``scaling``, the paper's Fig. 12), recovery (``recovery``,
Fig. 11), checkpoints (``checkpoint``) and membership (``peer``).

Times are seconds since the trace's first record. Each section runs one Spark query,
its log table (every record of its type, which comes to the driver as a final table
anyway); its summary is added up from that table in the driver. A recovery incident is one
(app, dead peer): when it was detected, restored and resumed (the first record of each
phase), and the durations the peers measured.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import functions as F

from agiledart.analysis.frames import Frames, of_arrow
from agiledart.analysis.model import Section

__all__ = ["checkpoint_section", "peer_section", "recovery_section", "scaling_section"]

PHASES = ("detected", "restored", "resumed")
DECISIONS = ("up", "down", "hold", "scale-out", "migrate")


def _by(table: pa.Table, keys: list[str], aggregates: list[tuple[Any, ...]]) -> pa.Table:
    """``table`` (a log: every record of a type, in the driver already) aggregated per
    ``keys``, its rows taken in order of time (``last``: the latest); aggregate
    ``(column, how)`` is named ``column_how`` (``count_all``: the rows)."""
    ordered = table.sort_by([(k, "ascending") for k in (*keys, "t_s")])
    return ordered.group_by(keys, use_threads=False).aggregate(aggregates)


def _where(table: pa.Table, column: str, value: str, of: str) -> pa.ChunkedArray:
    """``of`` where ``column`` is ``value``, else null."""
    return pc.if_else(pc.equal(table[column], value), table[of], None)


def scaling_section(frames: Frames) -> Section:
    section = Section("scaling", "Scaling", ("scaling",))
    if not frames.has("scaling"):
        return section
    log = (
        frames.records("scaling")
        .select(
            frames.t_s(), "app", "operator", "peer", "health", "instances", "target", "decision"
        )
        .toArrow()
    )
    counted = log.append_column("one", pa.array([1] * log.num_rows, pa.int64()))
    for d in DECISIONS:
        counted = counted.append_column(d, pc.if_else(pc.equal(log["decision"], d), 1, 0))
    summary = _by(
        counted,
        ["app", "operator"],
        [
            ("one", "sum"),
            *((d, "sum") for d in DECISIONS),
            ("instances", "min"),
            ("instances", "max"),
            ("instances", "last"),
            ("health", "mean"),
            ("health", "last"),
        ],
    ).rename_columns(
        {
            "one_sum": "decisions",
            **{f"{d}_sum": d for d in DECISIONS},
            "instances_min": "instances_min",
            "instances_max": "instances_max",
            "instances_last": "instances_last",
            "health_mean": "health_mean",
            "health_last": "health_last",
        }
    )
    section.tables += [
        of_arrow(summary, "scaling_summary", "Scaling per operator", ("app", "operator")),
        of_arrow(
            log,
            "scaling",
            "Scaling decisions (health and instances over time)",
            ("app", "operator", "t_s"),
        ),
    ]
    return section


def recovery_section(frames: Frames) -> Section:
    section = Section("recovery", "Failure recovery", ("recovery",))
    if not frames.has("recovery"):
        return section
    log = (
        frames.records("recovery")
        .select(
            frames.t_s(),
            "app",
            "dead_peer",
            "epoch",
            "phase",
            "duration_ms",
            F.array_join("operators", " ").alias("operators"),
        )
        .toArrow()
    )
    phased = log.select(["app", "dead_peer", "epoch", "t_s"])
    for p in PHASES:
        phased = phased.append_column(f"{p}_s", _where(log, "phase", p, "t_s"))
    for p in PHASES[1:]:
        phased = phased.append_column(f"{p}_ms", _where(log, "phase", p, "duration_ms"))
    found = _by(
        phased,
        ["app", "dead_peer"],
        [
            *((f"{p}_s", "min") for p in PHASES),
            *((f"{p}_ms", "max") for p in PHASES[1:]),
            ("epoch", "max"),
        ],
    )
    found = found.rename_columns(
        {
            **{f"{p}_s_min": f"{p}_s" for p in PHASES},
            **{f"{p}_ms_max": f"{p}_ms" for p in PHASES[1:]},
            "epoch_max": "epoch",
        }
    )
    found = found.append_column(
        "detect_to_resume_s", pc.subtract(found["resumed_s"], found["detected_s"])
    )
    section.tables += [
        of_arrow(
            found,
            "recovery_incidents",
            "Recovery incidents (one per app and dead peer)",
            ("detected_s", "app", "dead_peer"),
        ),
        of_arrow(log, "recovery_events", "Recovery events", ("t_s", "app")),
    ]
    return section


def checkpoint_section(frames: Frames) -> Section:
    section = Section("checkpoints", "Checkpoints", ("checkpoint",))
    if not frames.has("checkpoint"):
        return section
    log = (
        frames.records("checkpoint")
        .select(frames.t_s(), "app", "peer", "epoch", "bytes", "duration_ms", "m", "k", "committed")
        .toArrow()
    )
    counted = log.append_column("done", pc.if_else(log["committed"], 1, 0)).append_column(
        "one", pa.array([1] * log.num_rows, pa.int64())
    )
    summary = _by(
        counted,
        ["app"],
        [
            ("one", "sum"),
            ("done", "sum"),
            ("epoch", "max"),
            ("bytes", "mean"),
            ("duration_ms", "mean"),
            ("duration_ms", "max"),
        ],
    ).rename_columns(
        {
            "one_sum": "checkpoints",
            "done_sum": "committed",
            "epoch_max": "last_epoch",
            "bytes_mean": "bytes_mean",
            "duration_ms_mean": "duration_ms_mean",
            "duration_ms_max": "duration_ms_max",
        }
    )
    section.tables += [
        of_arrow(summary, "checkpoint_summary", "Checkpoints per app", ("app",)),
        of_arrow(log, "checkpoints", "Checkpoints", ("t_s", "app")),
    ]
    return section


def peer_section(frames: Frames) -> Section:
    section = Section("peers", "Membership", ("peer",))
    if not frames.has("peer"):
        return section
    log = frames.records("peer").select(frames.t_s(), "peer", "event", "subject", "zone").toArrow()
    summary = _by(log, ["event"], [([], "count_all")]).rename_columns({"count_all": "records"})
    section.tables += [
        of_arrow(summary, "peer_event_counts", "Membership events", ("event",)),
        of_arrow(log, "peer_events", "Membership events (who saw what)", ("t_s", "peer")),
    ]
    return section
