"""The report's sections that Spark computes: the queries of each, over all partitions.

A section (:mod:`~agiledart.analysis.metrics`, :mod:`~agiledart.analysis.routing`,
:mod:`~agiledart.analysis.placement`, :mod:`~agiledart.analysis.timelines`) runs one to
four Spark SQL queries over the partial aggregates the reader's tasks computed
(:mod:`~agiledart.analysis.partials`) and the Parquet records of its types
(:class:`~agiledart.analysis.frames.Frames`), and brings back only its final tables
(and merged partials of about their size, which the driver adds up into them); the
driver draws the figures (:func:`~agiledart.analysis.plots.of_section`).
"""

from __future__ import annotations

from collections.abc import Callable

from agiledart.analysis import metrics, placement, routing, timelines
from agiledart.analysis.frames import Frames
from agiledart.analysis.model import Section

__all__ = ["SECTIONS", "by_cost", "compute"]

#: the sections in report order (after the overview and the malformed lines): what
#: computes each, and the record type it reads (to start the costliest first)
SECTIONS: dict[str, tuple[Callable[[Frames], Section], str]] = {
    "latency": (metrics.latency_section, "tuple"),
    "throughput": (metrics.throughput_section, "opstats"),
    "routing": (routing.routing_section, "delivery"),
    "shuffle": (routing.shuffle_section, "shuffle"),
    "placement": (placement.placement_section, "placement"),
    "schedulers": (placement.scheduler_section, "scheduler"),
    "scaling": (timelines.scaling_section, "scaling"),
    "recovery": (timelines.recovery_section, "recovery"),
    "checkpoints": (timelines.checkpoint_section, "checkpoint"),
    "peers": (timelines.peer_section, "peer"),
}


def by_cost(frames: Frames) -> list[str]:
    """The sections, the one with most records first (what the cores are kept busy by)."""
    return sorted(SECTIONS, key=lambda key: -frames.counts.get(SECTIONS[key][1], 0))


def compute(key: str, frames: Frames) -> Section:
    """Compute section ``key`` (its Spark jobs, from the driver)."""
    return SECTIONS[key][0](frames)
