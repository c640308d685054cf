"""One analysis: read a trace directory, run every job, write the report."""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agiledart.analysis.errors import AnalysisUsageError
from agiledart.analysis.session import require_analysis_extra, spark_session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from agiledart.analysis.frames import Frames
    from agiledart.analysis.model import Section
    from agiledart.analysis.report import Rendered

__all__ = ["Analysis", "analyze"]

log = logging.getLogger("agiledart.analysis")

#: where, under the output directory, the reader keeps the records while the jobs run
PARTS = ".records"


@dataclass(frozen=True)
class Analysis:
    """What :func:`analyze` wrote and found."""

    out: Path
    report: Path
    lines: int
    records: dict[str, int]
    malformed: dict[str, int]
    seconds: float
    sections: list[Section]
    timings: dict[str, float]
    """Seconds spent reading (parse and cache), in the jobs, and writing the report."""
    tasks: dict[str, int] = field(default_factory=dict)
    """Per section that ran Spark jobs, the most tasks one of its stages ran."""

    @property
    def single_task_sections(self) -> int:
        """Sections whose every stage ran as one task (none, when the records of the
        types were written as more than one file: their scans are parallel)."""
        return sum(1 for n in self.tasks.values() if n <= 1)

    @property
    def malformed_total(self) -> int:
        return sum(self.malformed.values())


def analyze(
    trace_dir: Path,
    out: Path,
    *,
    window_s: float = 1.0,
    master: str | None = None,
    conf: Mapping[str, str] | None = None,
    spark: SparkSession | None = None,
) -> Analysis:
    """Analyze the traces under ``trace_dir`` and write tables, plots and
    ``report.html`` under ``out``.

    Spark runs locally (``local[2]``) unless ``master`` names a cluster; ``spark``
    reuses a session the caller owns instead (``master`` and ``conf`` are then unused).
    """
    if not (math.isfinite(window_s) and window_s > 0):
        msg = f"the window must be a positive number of seconds, got {window_s}"
        raise AnalysisUsageError(msg)
    if not Path(trace_dir).is_dir():
        msg = f"{trace_dir} is not a directory"
        raise AnalysisUsageError(msg)
    require_analysis_extra()
    if spark is not None:
        return _analyze(spark, Path(trace_dir), Path(out), window_s * 1000.0)
    with spark_session(master, conf) as session:
        return _analyze(session, Path(trace_dir), Path(out), window_s * 1000.0)


def _analyze(spark: SparkSession, trace_dir: Path, out: Path, window_ms: float) -> Analysis:
    from agiledart.analysis import overview
    from agiledart.analysis.reader import read_traces
    from agiledart.analysis.report import write_report

    started = time.perf_counter()
    log.info("reading the traces under %s", trace_dir)
    traces = read_traces(spark, trace_dir, out / PARTS, window_ms)
    read_at = time.perf_counter()
    log.info(
        "read %d lines from %d files in %.1f s; computing the tables",
        traces.lines,
        len(traces.files),
        read_at - started,
    )
    try:
        if traces.malformed.total:
            log.warning(
                "skipped %d malformed trace lines: %s",
                traces.malformed.total,
                ", ".join(f"{k} {v}" for k, v in traces.malformed.counts.items() if v),
            )
        first = [overview.overview_section(traces), overview.malformed_section(traces)]
        sections, rendered, tasks = _run(spark, traces.frames(window_ms), first)
    finally:
        traces.release()
    jobs_at = time.perf_counter()
    _clear(out)
    summary: dict[str, Any] = {
        "trace_dir": str(trace_dir),
        "files": len(traces.files),
        "lines": traces.lines,
        "records": traces.counts,
        "malformed": traces.malformed.counts,
        "window_s": window_ms / 1000.0,
        "t0_ms": traces.t0_ms,
        "t1_ms": traces.t1_ms,
        "tables": [t.name for s in sections for t in s.tables],
        "plots": [p.name for s in sections for p in s.plots],
        "empty_sections": [s.key for s in sections if s.empty],
        "section_tasks": tasks,
    }
    report = write_report(
        out, f"agiledart trace analysis: {trace_dir.name}", sections, summary, rendered
    )
    return Analysis(
        out=out,
        report=report,
        lines=traces.lines,
        records=dict(traces.counts),
        malformed=dict(traces.malformed.counts),
        seconds=time.perf_counter() - started,
        sections=sections,
        tasks=tasks,
        timings={
            "read_s": round(read_at - started, 2),
            "jobs_s": round(jobs_at - read_at, 2),
            "report_s": round(time.perf_counter() - jobs_at, 2),
        },
    )


def _run(
    spark: SparkSession, frames: Frames, first: list[Section]
) -> tuple[list[Section], list[Rendered], dict[str, int]]:
    """Run each section's queries (:mod:`~agiledart.analysis.sections`), every section
    at once, the costliest first, and render each (its CSV text and PNG images, on one
    thread: matplotlib is not thread-safe) as soon as it is done, while later ones
    still run. ``first`` are computed already. Also returns the Spark tasks each
    section's jobs ran, per stage at most (see :attr:`Analysis.tasks`).

    Every section is submitted at once, not a few at a time: a session's first Spark
    SQL query waits for the SQL engine to start (2-5 s in a fresh JVM on two cores), and
    the queries submitted meanwhile wait with it, while a section held back until
    another is done starts its planning only then (10 million trace lines: the jobs
    about 1 s shorter than four at a time, on ``local[1]`` and ``local[2]``). Spark
    runs the tasks of the jobs first come, first served, and each section's result is
    a final table, which the report holds anyway."""
    from agiledart.analysis.plots import of_section
    from agiledart.analysis.report import render
    from agiledart.analysis.sections import SECTIONS, by_cost, compute

    context = spark.sparkContext
    run_id = uuid.uuid4().hex[:8]

    tasks: dict[str, int] = {}

    def job(key: str) -> Section:
        group = f"agiledart-{run_id}-{key}"
        context.setJobGroup(group, f"agiledart analyze: {key}")
        section = compute(key, frames)
        # asked here, while other sections' jobs run, rather than all at the end
        tasks[key] = _widest_stage(context, group)
        section.plots[:] = of_section(section)
        return section

    order = [s.key for s in first] + list(SECTIONS)
    with (
        ThreadPoolExecutor(len(SECTIONS), thread_name_prefix="analyze") as pool,
        ThreadPoolExecutor(1, thread_name_prefix="render") as painter,
    ):
        sections = {s.key: s for s in first}
        rendering = {s.key: painter.submit(render, s) for s in first}
        log.info("0/%d sections", len(SECTIONS))
        running = {pool.submit(job, key): key for key in by_cost(frames)}
        try:
            for n, done in enumerate(as_completed(running), start=1):
                section = done.result()
                sections[section.key] = section
                rendering[section.key] = painter.submit(render, section)
                log.info("%d/%d sections: %s", n, len(SECTIONS), section.title)
        except BaseException:
            pool.shutdown(cancel_futures=True)
            raise
        return (
            [sections[k] for k in order],
            [rendering[k].result() for k in order],
            {k: tasks[k] for k in SECTIONS if tasks.get(k)},
        )


def _widest_stage(context: Any, group: str) -> int:
    """The most tasks any stage of the job group's jobs ran (0: no job ran)."""
    tracker = context.statusTracker()
    widest = 0
    for job_id in tracker.getJobIdsForGroup(group):
        info = tracker.getJobInfo(job_id)
        for stage_id in info.stageIds if info is not None else []:
            stage = tracker.getStageInfo(stage_id)
            if stage is not None:
                widest = max(widest, stage.numTasks)
    return widest


def _clear(out: Path) -> None:
    """Remove what an earlier analysis wrote to ``out`` (and nothing else)."""
    for pattern in ("tables/*.csv", "plots/*.png"):
        for old in out.glob(pattern):
            old.unlink()
