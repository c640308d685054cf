"""Placement strategies beyond JOIN routing: RTR, RTR+RP and the baselines.

An app spec's ``placement`` picks how its operators are placed:

================  ==========================================================
``join-routing``  along the JOIN paths (default; :mod:`agiledart.placement`)
``rtr``           latency-aware, response time per operator (RTR)
``rtr-rp``        RTR with region patterns: edge sinks' paths on the edge
``cloud-only``    every operator on the cloud peers
``lb``            least-loaded peers, latency ignored
``random``        a seeded random peer per operator (a control)
================  ==========================================================

The core is pure: :func:`place_with` takes the app, a :class:`Topology` (hosts with
speed, spare capacity and zone; a :class:`Network` of latencies and bandwidths) and a
:class:`Workload` (rates, costs, selectivities) and returns a
:class:`~agiledart.placement.Placement`. :mod:`agiledart.strategies.survey` builds
the topology of a live ring (peers' ``ring`` answers, the emulated link model).

Errors::

    PlacementError (agiledart.placement)
    └── StrategyError   unknown strategy, no usable host, a bad host or link value
"""

from agiledart.strategies.model import (
    CLOUD_ZONE,
    Host,
    Network,
    StrategyError,
    Topology,
    Workload,
)
from agiledart.strategies.regions import Region, deployment_sequence, regions, split_points
from agiledart.strategies.rtr import STRATEGIES, place_with

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
