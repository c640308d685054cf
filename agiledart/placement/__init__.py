"""Operator placement (paper §IV-B): JOIN routing, RTR, RTR+RP and the baselines.

An app spec's ``placement`` picks how its operators are placed:

================  ==========================================================
``join-routing``  along the JOIN paths (default; :mod:`agiledart.placement.join`)
``rtr``           latency-aware, response time per operator (RTR)
``rtr-rp``        RTR with region patterns: edge sinks' paths on the edge
``cloud-only``    every operator on the cloud peers
``lb``            least-loaded peers, latency ignored
``random``        a seeded random peer per operator (a control)
================  ==========================================================

The core is pure: :func:`place_with` takes the app, a :class:`Topology` (hosts with
speed, spare capacity and zone; a :class:`Network` of latencies and bandwidths) and a
:class:`Workload` (rates, costs, selectivities) and returns a
:class:`~agiledart.placement.join.Placement`. :mod:`agiledart.placement.survey` builds
the topology of a live ring (peers' ``ring`` answers, the emulated link model).

Errors::

    PlacementError (agiledart.placement.join)
    └── StrategyError   unknown strategy, no usable host, a bad host or link value
"""

from agiledart.placement.model import (
    CLOUD_ZONE,
    Host,
    Network,
    StrategyError,
    Topology,
    Workload,
)
from agiledart.placement.regions import Region, deployment_sequence, regions, split_points
from agiledart.placement.rtr import STRATEGIES, place_with

__all__ = [
    "CLOUD_ZONE",
    "STRATEGIES",
    "Host",
    "Network",
    "Region",
    "StrategyError",
    "Topology",
    "Workload",
    "deployment_sequence",
    "place_with",
    "regions",
    "split_points",
]
