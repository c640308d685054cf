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

#: the sections in report order (after the overview and the malformed lines): what
#: computes each, and the record type it reads (to start the costliest first)
SECTIONS: dict[str, tuple[Callable[[Source], Section], str]] = {
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


def by_cost(source: Source) -> list[str]:
    """The sections, the one with most records first (what the cores are kept busy by)."""
    return sorted(SECTIONS, key=lambda key: -source.counts.get(SECTIONS[key][1], 0))


def compute(key: str, source: Source) -> Section:
    """Compute section ``key`` (the Spark task)."""
    return SECTIONS[key][0](source)
