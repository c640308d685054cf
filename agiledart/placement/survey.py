"""The topology of a live ring, for the strategies (the scheduler's driver).

:func:`survey` asks candidate peers for their ``ring`` answer (the pinned peers first,
then every other peer the scheduler knows, up to ``limit``); :func:`topology_of` is the
pure part and turns those answers into a :class:`Topology`:

* a host per answering peer: speed :data:`SPEED_PER_WORKER` times its worker count,
  spare capacity as its contacts last heard it (the lowest report), its zone, and the
  apps it already runs as ``hosted``;
* latency: where the emulated link model (``peer --links``) covers both peers, the
  expected delay of the best path in it; elsewhere half the RTTs the peers measured
  to each other, completed into all pairs by shortest paths. Bandwidth: the link
  model's ``bandwidth_mbit`` (every peer's upload rate), else unlimited.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

from agiledart.errors import AgiledartError
from agiledart.placement.model import Host, Network, Topology

__all__ = ["SPEED_PER_WORKER", "LinkDelays", "survey", "topology_of"]

#: Work units per second one worker process gives (a map costs 1 per event; a
#: peer ran 115,000 - 471,000 pipeline records/s in bench_pipeline.py).
SPEED_PER_WORKER = 100_000.0

Address = tuple[str, int]
Request = Callable[..., Awaitable[Any]]
Resolve = Callable[[str], Awaitable[tuple[int, Address] | None]]


class LinkDelays(Protocol):
    """What :class:`~agiledart.runtime.linkmodel.LinkModel` offers a strategy."""

    @property
    def bandwidth_mbit(self) -> float | None: ...

    def covers(self, peer: str) -> bool: ...

    def optimal_ms(self, origin: str, dest: str, grace_ms: float = 0.0) -> float | None: ...


async def survey(
    *,
    names: Sequence[str],
    pinned: Sequence[str],
    resolve: Resolve,
    request: Request,
    link_model: LinkDelays | None = None,
    limit: int = 32,
) -> tuple[Topology, dict[str, Address]]:
    """The topology of up to ``limit`` peers (``pinned`` always among them) and their
    addresses. Peers that do not answer are left out."""
    others = sorted(set(names) - set(pinned))
    candidates = list(dict.fromkeys([*pinned, *others]))[: max(limit, len(pinned))]

    async def ask(name: str) -> tuple[str, Address, dict[str, Any]] | None:
        where = await resolve(name)
        if where is None:
            return None
        try:
            ring = await request(where[1], "ring", {}, timeout=5.0)
        except AgiledartError:
            return None
        return (name, where[1], ring) if isinstance(ring, dict) else None

    answers = [a for a in await asyncio.gather(*(ask(n) for n in candidates)) if a]
    rings = {name: ring for name, _, ring in answers}
    return topology_of(rings, link_model), {name: addr for name, addr, _ in answers}


def topology_of(
    rings: Mapping[str, Mapping[str, Any]], link_model: LinkDelays | None = None
) -> Topology:
    """Hosts and network from peers' ``ring`` answers (see the module doc)."""
    spare: dict[str, float] = {}
    measured: dict[tuple[str, str], float] = {}
    for name, ring in rings.items():
        for p in _list(ring.get("peers")):
            other = p.get("name") if isinstance(p, dict) else None
            if not isinstance(other, str) or other == name:
                continue
            cap = _number(p.get("capacity"))
            if cap is not None:
                spare[other] = min(spare.get(other, 1.0), min(max(cap, 0.0), 1.0))
            rtt = _number(p.get("rtt_ms"))
            if rtt is not None and rtt >= 0:
                key = (name, other) if name < other else (other, name)
                measured[key] = min(measured.get(key, math.inf), rtt / 2.0)
    hosts = []
    for name, ring in sorted(rings.items()):
        execution = ring.get("execution")
        workers = _number(execution.get("workers")) if isinstance(execution, dict) else None
        zone = ring.get("zone")
        hosts.append(
            Host(
                name=name,
                speed=SPEED_PER_WORKER * max(1.0, workers or 1.0),
                spare=spare.get(name, 1.0),
                zone=zone if isinstance(zone, str) else "default",
                hosted=len(_list(ring.get("apps"))),
            )
        )
    network = Network.from_links(measured)
    if link_model is not None:
        network = _with_model(network, sorted(rings), link_model)
    return Topology.of(hosts, network)


def _with_model(network: Network, names: Sequence[str], model: LinkDelays) -> Network:
    pairs = dict(network.latency_ms)
    for a in names:
        for b in names:
            if a != b and model.covers(a) and model.covers(b):
                ms = model.optimal_ms(a, b)
                if ms is not None:
                    pairs[(a, b)] = ms
    return Network(
        latency_ms=pairs, bandwidth_mbit=model.bandwidth_mbit, unknown_ms=network.unknown_ms
    )


def _list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else []


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None
