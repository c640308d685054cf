"""RTR and RTR+RP (Veith et al., ICSOC 2018, §3.2), and the baselines of its evaluation (§4.1).

* **RTR** (Response Time Rate): operators in the deployment sequence (regions
  breadth-first from the sources, :mod:`agiledart.placement.regions`); each goes to
  the host with the lowest estimated response time: transfer from its placed inputs
  (Eq. 8) + compute on that host with what is already there (Eq. 7) + the latency
  still to go to the sinks it feeds. Hosts that cannot keep up (μ <= λ, a saturated
  link) are out; if no host can, the least utilised one takes it (an overloaded
  estimate never refuses an app: the runtime's backpressure and scaling handle it).
* **RTR+RP** (with region patterns): an operator on a path to an *edge* sink (one
  pinned to a non-cloud peer, e.g. an actuator on a gateway) is an edge candidate and
  placed by RTR among the edge hosts; one that only feeds cloud sinks is a cloud
  candidate and goes to the cloud without a response-time estimate, as do edge
  candidates no edge host can keep up with.
* **cloud-only**: every operator on the cloud (pinned ones stay pinned): the cloud
  host already holding one of its inputs if it keeps up, else the one with the most
  free speed.
* **lb** (load balancing): the host least utilised with the operator added, whatever
  the latency.
* **random**: a uniformly random host per operator, seeded by the app's name (a
  control).

Cloud hosts are those in zone ``cloud``; without any, those with the most free speed
(:meth:`Topology.cloud`). Operators pinned with ``peer:`` stay where they are. Every
strategy chooses among the hosts that keep data from coming back to a peer it left
(:meth:`Assignment.allowed`).
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable, Sequence

from agiledart.app.spec import AppSpec
from agiledart.placement.assign import Assignment, to_placement
from agiledart.placement.join import Placement
from agiledart.placement.model import StrategyError, Topology, Workload
from agiledart.placement.regions import deployment_sequence

__all__ = ["STRATEGIES", "place_with"]

Chooser = Callable[[Assignment, str, Sequence[str]], str]


def _rtr(a: Assignment, op: str, hosts: Sequence[str]) -> str:
    return a.best(op, hosts) or a.least_used(op, hosts)


def _rtr_rp(a: Assignment, op: str, hosts: Sequence[str]) -> str:
    cloud = set(a.topology.cloud())
    edge = [h for h in hosts if h not in cloud]
    if edge and any(a.host[k] not in cloud for k in a.sinks_fed(op)):
        chosen = a.best(op, edge)
        if chosen is not None:
            return chosen
    return _cloud_only(a, op, hosts)


def _cloud_only(a: Assignment, op: str, hosts: Sequence[str]) -> str:
    cloud = [h for h in a.topology.cloud() if h in hosts] or list(hosts)
    feeding = {a.host[i] for i in a.app.operator(op).inputs}
    keeps_up = [h for h in cloud if a.utilisation(op, h) < 1.0]
    for h in keeps_up:
        if h in feeding:
            return h
    pool = keeps_up or cloud
    return min(pool, key=lambda h: (-a.free(h), a.count.get(h, 0), h))


def _lb(a: Assignment, op: str, hosts: Sequence[str]) -> str:
    return a.least_used(op, hosts)


_CHOOSERS: dict[str, Chooser] = {
    "rtr": _rtr,
    "rtr-rp": _rtr_rp,
    "cloud-only": _cloud_only,
    "lb": _lb,
}
#: Strategies this module implements (``join-routing`` is :func:`agiledart.placement.place`).
STRATEGIES = (*_CHOOSERS, "random")


def place_with(
    strategy: str,
    app: AppSpec,
    topology: Topology,
    workload: Workload | None = None,
) -> Placement:
    """Place ``app``'s operators on ``topology``'s hosts with ``strategy``.

    Pure: the same inputs give the same placement. ``workload`` defaults to the
    estimates :meth:`Workload.of` reads from the spec. Raises :class:`StrategyError`
    for an unknown strategy or a topology without a usable host.
    """
    if strategy not in STRATEGIES:
        msg = f"unknown placement strategy {strategy!r}; use one of {STRATEGIES}"
        raise StrategyError(msg)
    hosts = tuple(n for n, h in topology.hosts.items() if h.budget > 0)
    if not hosts:
        msg = f"no host with spare capacity to place app {app.name!r} on"
        raise StrategyError(msg)
    a = Assignment(app, topology, workload or Workload.of(app))
    rng = random.Random(zlib.crc32(app.name.encode()))
    for op in deployment_sequence(app):
        pinned = app.operator(op).peer
        if pinned is not None:
            a.assign(op, pinned)
        elif strategy == "random":
            a.assign(op, rng.choice(a.allowed(op, hosts)))
        else:
            a.assign(op, _CHOOSERS[strategy](a, op, a.allowed(op, hosts)))
    return to_placement(a, strategy)
