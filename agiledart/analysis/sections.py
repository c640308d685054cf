"""The report's sections that Spark computes, each one job: what its task runs.

A task (in Spark's Python worker) reads the Arrow files of the record types it needs
(:class:`~agiledart.analysis.columns.Source`) and returns its
:class:`~agiledart.analysis.model.Section` with its tables, which Spark pickles back to
the driver; the driver draws the figures (:func:`~agiledart.analysis.plots.of_section`).
"""

from __future__ import annotations

from collections.abc import Callable

from agiledart.analysis import metrics, placement, routing, timelines
from agiledart.analysis.columns import Source
from agiledart.analysis.model import Section

__all__ = ["SECTIONS", "by_cost", "compute"]

#: the sections in report order (after the overview and the malformed lines)
SECTIONS: dict[str, Callable[[Source], Section]] = {
    "latency": metrics.latency_section,
    "throughput": metrics.throughput_section,
    "routing": routing.routing_section,
    "shuffle": routing.shuffle_section,
    "placement": placement.placement_section,
    "schedulers": placement.scheduler_section,
    "scaling": timelines.scaling_section,
    "recovery": timelines.recovery_section,
    "checkpoints": timelines.checkpoint_section,
    "peers": timelines.peer_section,
}

#: the record types each section reads, to start the costliest first
_READS = {
    "latency": "tuple",
    "throughput": "opstats",
    "routing": "delivery",
    "shuffle": "shuffle",
    "placement": "placement",
    "schedulers": "scheduler",
    "scaling": "scaling",
    "recovery": "recovery",
    "checkpoints": "checkpoint",
    "peers": "peer",
}


def by_cost(source: Source) -> list[str]:
    """The sections, the one with most records first (what the cores are kept busy by)."""
    return sorted(SECTIONS, key=lambda key: -source.counts.get(_READS[key], 0))


def compute(key: str, source: Source) -> Section:
    """Compute section ``key`` (the Spark task)."""
    return SECTIONS[key](source)
