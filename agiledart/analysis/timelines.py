"""Timelines: scaling (``scaling``, the paper's Fig. 12), recovery (``recovery``,
Fig. 11), checkpoints (``checkpoint``) and membership (``peer``).

Times are seconds since the trace's first record. A recovery incident is one
(app, dead peer): when it was detected, restored and resumed (the first record of each
phase), and the durations the peers measured.
"""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F

from agiledart.analysis import plots
from agiledart.analysis.model import Section, collect
from agiledart.analysis.reader import Traces

__all__ = ["checkpoint_section", "peer_section", "recovery_section", "scaling_section"]

PHASES = ("detected", "restored", "resumed")
DECISIONS = ("up", "down", "hold", "scale-out", "migrate")


def _t(traces: Traces) -> Column:
    return ((F.col("ts") - F.lit(traces.t0_ms or 0.0)) / 1000.0).alias("t_s")


def scaling_section(traces: Traces) -> Section:
    section = Section("scaling", "Scaling", ("scaling",))
    if not traces.has("scaling"):
        return section
    decisions = traces.records("scaling")
    timeline = collect(
        decisions.select(
            _t(traces), "app", "operator", "peer", "health", "instances", "target", "decision"
        ).orderBy("app", "operator", "t_s"),
        "scaling",
        "Scaling decisions (health and instances over time)",
    )
    summary = collect(
        decisions.groupBy("app", "operator")
        .agg(
            F.count(F.lit(1)).alias("decisions"),
            *(F.count_if(F.col("decision") == d).alias(d) for d in DECISIONS),
            F.min("instances").alias("instances_min"),
            F.max("instances").alias("instances_max"),
            F.max_by("instances", "ts").alias("instances_last"),
            F.mean("health").alias("health_mean"),
            F.max_by("health", "ts").alias("health_last"),
        )
        .orderBy("app", "operator"),
        "scaling_summary",
        "Scaling per operator",
    )
    section.tables += [summary, timeline]
    section.plots.append(plots.scaling(timeline))
    return section


def recovery_section(traces: Traces) -> Section:
    section = Section("recovery", "Failure recovery", ("recovery",))
    if not traces.has("recovery"):
        return section
    events = traces.records("recovery").select(
        _t(traces),
        "ts",
        "app",
        "dead_peer",
        "epoch",
        "phase",
        "duration_ms",
        F.array_join("operators", " ").alias("operators"),
    )
    log = collect(events.drop("ts").orderBy("t_s", "app"), "recovery_events", "Recovery events")
    first = [F.min(F.when(F.col("phase") == p, F.col("t_s"))).alias(f"{p}_s") for p in PHASES]
    took = [
        F.max(F.when(F.col("phase") == p, F.col("duration_ms"))).alias(f"{p}_ms")
        for p in PHASES[1:]
    ]
    incidents = collect(
        events.groupBy("app", "dead_peer")
        .agg(*first, *took, F.max("epoch").alias("epoch"))
        .withColumn("detect_to_resume_s", F.col("resumed_s") - F.col("detected_s"))
        .orderBy("detected_s", "app", "dead_peer"),
        "recovery_incidents",
        "Recovery incidents (one per app and dead peer)",
    )
    section.tables += [incidents, log]
    section.plots.append(plots.recovery(incidents))
    return section


def checkpoint_section(traces: Traces) -> Section:
    section = Section("checkpoints", "Checkpoints", ("checkpoint",))
    if not traces.has("checkpoint"):
        return section
    checkpoints = traces.records("checkpoint")
    summary = collect(
        checkpoints.groupBy("app")
        .agg(
            F.count(F.lit(1)).alias("checkpoints"),
            F.count_if("committed").alias("committed"),
            F.max("epoch").alias("last_epoch"),
            F.mean("bytes").alias("bytes_mean"),
            F.mean("duration_ms").alias("duration_ms_mean"),
            F.max("duration_ms").alias("duration_ms_max"),
        )
        .orderBy("app"),
        "checkpoint_summary",
        "Checkpoints per app",
    )
    log = collect(
        checkpoints.select(
            _t(traces), "app", "peer", "epoch", "bytes", "duration_ms", "m", "k", "committed"
        ).orderBy("t_s", "app"),
        "checkpoints",
        "Checkpoints",
    )
    section.tables += [summary, log]
    section.plots.append(plots.checkpoints(log))
    return section


def peer_section(traces: Traces) -> Section:
    section = Section("peers", "Membership", ("peer",))
    if not traces.has("peer"):
        return section
    events = traces.records("peer")
    summary = collect(
        events.groupBy("event").agg(F.count(F.lit(1)).alias("records")).orderBy("event"),
        "peer_event_counts",
        "Membership events",
    )
    log = collect(
        events.select(_t(traces), "peer", "event", "subject", "zone").orderBy("t_s", "peer"),
        "peer_events",
        "Membership events (who saw what)",
    )
    section.tables += [summary, log]
    section.plots.append(plots.peer_events(log))
    return section
