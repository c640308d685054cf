"""Timelines: scaling (``scaling``, the paper's Fig. 12), recovery (``recovery``,
Fig. 11), checkpoints (``checkpoint``) and membership (``peer``).

Times are seconds since the trace's first record. A recovery incident is one
(app, dead peer): when it was detected, restored and resumed (the first record of each
phase), and the durations the peers measured.
"""

from __future__ import annotations

from pyspark.sql import functions as F

from agiledart.analysis.frames import Frames, collect
from agiledart.analysis.model import Section

__all__ = ["checkpoint_section", "peer_section", "recovery_section", "scaling_section"]

PHASES = ("detected", "restored", "resumed")
DECISIONS = ("up", "down", "hold", "scale-out", "migrate")


def scaling_section(frames: Frames) -> Section:
    section = Section("scaling", "Scaling", ("scaling",))
    if not frames.has("scaling"):
        return section
    decisions = frames.records("scaling")
    timeline = collect(
        decisions.select(
            frames.t_s(), "app", "operator", "peer", "health", "instances", "target", "decision"
        ),
        "scaling",
        "Scaling decisions (health and instances over time)",
        ("app", "operator", "t_s"),
    )
    summary = collect(
        decisions.groupBy("app", "operator").agg(
            F.count(F.lit(1)).alias("decisions"),
            *(F.count_if(F.col("decision") == d).alias(d) for d in DECISIONS),
            F.min("instances").alias("instances_min"),
            F.max("instances").alias("instances_max"),
            F.max_by("instances", "ts").alias("instances_last"),
            F.mean("health").alias("health_mean"),
            F.max_by("health", "ts").alias("health_last"),
        ),
        "scaling_summary",
        "Scaling per operator",
        ("app", "operator"),
    )
    section.tables += [summary, timeline]
    return section


def recovery_section(frames: Frames) -> Section:
    section = Section("recovery", "Failure recovery", ("recovery",))
    if not frames.has("recovery"):
        return section
    events = frames.records("recovery").select(
        frames.t_s(),
        "ts",
        "app",
        "dead_peer",
        "epoch",
        "phase",
        "duration_ms",
        F.array_join("operators", " ").alias("operators"),
    )
    log = collect(events.drop("ts"), "recovery_events", "Recovery events", ("t_s", "app"))
    first = [F.min(F.when(F.col("phase") == p, F.col("t_s"))).alias(f"{p}_s") for p in PHASES]
    took = [
        F.max(F.when(F.col("phase") == p, F.col("duration_ms"))).alias(f"{p}_ms")
        for p in PHASES[1:]
    ]
    incidents = collect(
        events.groupBy("app", "dead_peer")
        .agg(*first, *took, F.max("epoch").alias("epoch"))
        .withColumn("detect_to_resume_s", F.col("resumed_s") - F.col("detected_s")),
        "recovery_incidents",
        "Recovery incidents (one per app and dead peer)",
        ("detected_s", "app", "dead_peer"),
    )
    section.tables += [incidents, log]
    return section


def checkpoint_section(frames: Frames) -> Section:
    section = Section("checkpoints", "Checkpoints", ("checkpoint",))
    if not frames.has("checkpoint"):
        return section
    checkpoints = frames.records("checkpoint")
    summary = collect(
        checkpoints.groupBy("app").agg(
            F.count(F.lit(1)).alias("checkpoints"),
            F.count_if("committed").alias("committed"),
            F.max("epoch").alias("last_epoch"),
            F.mean("bytes").alias("bytes_mean"),
            F.mean("duration_ms").alias("duration_ms_mean"),
            F.max("duration_ms").alias("duration_ms_max"),
        ),
        "checkpoint_summary",
        "Checkpoints per app",
        ("app",),
    )
    log = collect(
        checkpoints.select(
            frames.t_s(), "app", "peer", "epoch", "bytes", "duration_ms", "m", "k", "committed"
        ),
        "checkpoints",
        "Checkpoints",
        ("t_s", "app"),
    )
    section.tables += [summary, log]
    return section


def peer_section(frames: Frames) -> Section:
    section = Section("peers", "Membership", ("peer",))
    if not frames.has("peer"):
        return section
    events = frames.records("peer")
    summary = collect(
        events.groupBy("event").agg(F.count(F.lit(1)).alias("records")),
        "peer_event_counts",
        "Membership events",
        ("event",),
    )
    log = collect(
        events.select(frames.t_s(), "peer", "event", "subject", "zone"),
        "peer_events",
        "Membership events (who saw what)",
        ("t_s", "peer"),
    )
    section.tables += [summary, log]
    return section
