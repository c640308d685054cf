"""Regret simulator (paper §V-A, §VII-F/G).

Packets k = 1..K go one after another from the source to the sink. At each node the
policy names a link; the link is attempted until a transmission succeeds, each attempt
taking one slot (``graph.slot_ms``) and succeeding with the link's θ, so the hop's
delay is geometric with mean slot_ms / θ. The policy gets the hop's feedback (attempts,
one success); a policy that re-decides after every attempt sees the same decisions,
see :mod:`agiledart.bandit.policies`. Regret after K packets is::

    R(K) = Σ_k D(k) - K · D(p*)

with D(k) the realised delay of packet k and D(p*) the expected delay of the optimal
path. :meth:`SimResult.pseudo_regret` replaces D(k) by the expected delay of the path
packet k took; both have the same mean, the second far less noise.

Randomness: each link draws its attempt counts from its own stream, spawned from one
seed, so two policies run with the same seed see the same outcome on the j-th use of
any link (common random numbers: their difference in regret is due to their choices,
not luck). Nothing here reads a clock.

Traces: ``on_decision`` (optional) receives one plain dict per hop::

    {"policy": "agiledart", "graph": "road-144", "packet": 7, "hop": 0, "link": 12,
     "from": "n0", "to": "n1", "attempts": 3, "outcome": "delivered", "delay_ms": 30.0}
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from agiledart.bandit.errors import BanditError, BanditUsageError
from agiledart.bandit.graph import Graph
from agiledart.bandit.paths import optimal_path
from agiledart.bandit.policies import RoutingPolicy

__all__ = ["DecisionSink", "LinkDelays", "Seed", "SimResult", "simulate"]

DecisionSink = Callable[[dict[str, Any]], None]
Seed = int | Sequence[int] | np.random.SeedSequence

_CHUNK = 64


class LinkDelays:
    """Attempts-until-success per link, one random stream per link."""

    def __init__(self, graph: Graph, seed: Seed) -> None:
        root = seed if isinstance(seed, np.random.SeedSequence) else np.random.SeedSequence(seed)
        self._seeds = root.spawn(graph.n_links)
        self._theta = graph.theta.tolist()
        self._rngs: list[np.random.Generator | None] = [None] * graph.n_links
        self._buffers: list[list[int]] = [[] for _ in range(graph.n_links)]

    def draw(self, link: int) -> int:
        """Number of attempts the next packet on ``link`` needs (>= 1)."""
        buffer = self._buffers[link]
        if not buffer:
            rng = self._rngs[link]
            if rng is None:
                rng = self._rngs[link] = np.random.default_rng(self._seeds[link])
            buffer.extend(rng.geometric(self._theta[link], size=_CHUNK)[::-1].tolist())
        return buffer.pop()


@dataclass(frozen=True, eq=False)
class SimResult:
    """What one policy did over K packets on one graph."""

    policy: str
    graph: str
    delay_ms: NDArray[np.float64]
    """Realised delay of each packet."""
    expected_delay_ms: NDArray[np.float64]
    """Expected delay of the path each packet took."""
    optimal_delay_ms: float
    """D(p*)."""
    optimal_path: tuple[int, ...]
    paths: tuple[tuple[int, ...], ...]
    """Links of each packet's path."""

    @property
    def packets(self) -> int:
        return len(self.delay_ms)

    def regret(self) -> NDArray[np.float64]:
        """R(k) = Σ_{i<=k} D(i) - k · D(p*) for k = 1..K, realised delays, in ms."""
        return np.cumsum(self.delay_ms - self.optimal_delay_ms)

    def pseudo_regret(self) -> NDArray[np.float64]:
        """As :meth:`regret`, with each packet's path's expected delay."""
        return np.cumsum(self.expected_delay_ms - self.optimal_delay_ms)

    def on_optimal(self) -> NDArray[np.bool_]:
        """Whether each packet took p*."""
        return np.fromiter((p == self.optimal_path for p in self.paths), bool, self.packets)

    def trials_to_optimal(self, window: int = 10) -> int | None:
        """First packet number k (1-based) from which ``window`` packets in a row took p*.

        None if that never happened.
        """
        run = 0
        for k, hit in enumerate(self.on_optimal().tolist(), start=1):
            run = run + 1 if hit else 0
            if run == window:
                return k - window + 1
        return None

    def share_under(self, delay_ms: float) -> float:
        """Fraction of packets whose realised delay was below ``delay_ms``."""
        return float(np.mean(self.delay_ms < delay_ms))


def simulate(
    graph: Graph,
    policy: RoutingPolicy,
    *,
    packets: int,
    seed: Seed,
    on_decision: DecisionSink | None = None,
) -> SimResult:
    """Route ``packets`` packets with ``policy`` and record what happened."""
    if packets < 1:
        msg = f"packets must be >= 1, got {packets}"
        raise BanditUsageError(msg)
    delays = LinkDelays(graph, seed)
    opt_links, opt_ms = optimal_path(graph)
    tail, head = graph.tail.tolist(), graph.head.tolist()
    mean_slots = (1.0 / graph.theta).tolist()
    slot_ms, source, sink, ids = graph.slot_ms, graph.source, graph.sink, graph.node_ids
    realised = np.empty(packets)
    expected = np.empty(packets)
    paths: list[tuple[int, ...]] = []
    for k in range(1, packets + 1):
        policy.begin_packet(k)
        node, visited = source, {source}
        links: list[int] = []
        slots, expected_slots = 0, 0.0
        while node != sink:
            link = policy.next_link(node, visited)
            nxt = head[link]
            if tail[link] != node or nxt in visited:
                msg = f"{policy.name} chose link {link}, not a loop-free link out of {ids[node]!r}"
                raise BanditError(msg)
            attempts = delays.draw(link)
            policy.record(link, attempts, 1)
            if on_decision is not None:
                on_decision(
                    {
                        "policy": policy.name,
                        "graph": graph.name,
                        "packet": k,
                        "hop": len(links),
                        "link": link,
                        "from": ids[node],
                        "to": ids[nxt],
                        "attempts": attempts,
                        "outcome": "delivered",
                        "delay_ms": attempts * slot_ms,
                    }
                )
            slots += attempts
            expected_slots += mean_slots[link]
            links.append(link)
            visited.add(nxt)
            node = nxt
        realised[k - 1] = slots * slot_ms
        expected[k - 1] = expected_slots * slot_ms
        paths.append(tuple(links))
    return SimResult(
        policy=policy.name,
        graph=graph.name,
        delay_ms=realised,
        expected_delay_ms=expected,
        optimal_delay_ms=opt_ms,
        optimal_path=tuple(opt_links),
        paths=tuple(paths),
    )
