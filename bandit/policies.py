"""Routing policies: AgileDART's Algorithm 1, its baselines and its ablations.

Every policy speaks the same small protocol (:class:`RoutingPolicy`), which the
simulator drives one packet at a time:

1. ``begin_packet(tau)``: packet number ``tau`` (1-based; the τ of the KL-UCB bound)
   leaves the source;
2. ``next_link(node, visited)``: the packet is at ``node`` and has visited ``visited``
   (the source included); the policy names the link to send it on;
3. ``record(link, attempts, successes)``: feedback from the link: ``attempts``
   transmission attempts, ``successes`` of them successful. Per-attempt feedback is
   ``record(link, 1, 0)`` / ``record(link, 1, 1)``; a hop retried until success may
   report in one call.

Policies (paper §V, §VII-F/G):

* :class:`KlUcbRouting` (AgileDART): next hop = argmin_w ω(v, w) + J(w), ω the KL-UCB
  cost, J shortest paths over ω. ``hops`` gives the "hops considered" ablation.
* :class:`EndToEndLcbRouting` (Gai et al.): the source fixes the whole path minimising
  the sum of per-link lower confidence bounds on delay.
* :class:`NextHopRouting` (Bhorkar et al.): each hop takes the progress link with the
  lowest empirical delay, looking no further.
* :class:`OptimalRouting`: p*, from the true θ.

Why J is computed once per packet. ω depends on τ through C log τ, so every tried
link's cost moves when τ does: a full refresh per packet (vectorised ω, then Dijkstra;
~0.3 ms at 144 nodes) is unavoidable and is what :meth:`KlUcbRouting.begin_packet`
does. Feedback during the packet updates the link's statistics, and its ω before
anyone asks for it again, but not J. For a packet that retries its chosen link until
success (the simulator's model) that is exact, not an approximation: the packet follows
a shortest-path tree of the packet-start J, J falls strictly along it (all ω >= 1), so
no candidate's best continuation runs through a visited node; and feedback only
touched links leaving visited nodes, which no loop-free continuation uses. A J
recomputed after every attempt over loop-free continuations would give the same
decisions. (A driver that re-decides at the same node after a failure gets the fresh
ω of that node's links with the packet-start J.)
"""

from __future__ import annotations

import math
from collections.abc import Container
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from agiledart.bandit.errors import BanditUsageError, NoRouteError
from agiledart.bandit.graph import Graph
from agiledart.bandit.klucb import exploration_bound, kl_ucb_cost_one, kl_ucb_upper
from agiledart.bandit.paths import (
    costs_to_sink,
    lookahead_costs,
    optimal_path,
    progress_links,
    route_from,
)

__all__ = [
    "DEFAULT_EXPLORATION",
    "EndToEndLcbRouting",
    "KlUcbRouting",
    "LinkStats",
    "NextHopRouting",
    "OptimalRouting",
    "RoutingPolicy",
]

DEFAULT_EXPLORATION = 0.2
"""C used when none is given; Fig. 17(d) shows the best C depends on the network."""


class RoutingPolicy(Protocol):
    """What the simulator (or any driver) needs from a policy."""

    name: str

    def begin_packet(self, tau: int) -> None: ...

    def next_link(self, node: int, visited: Container[int]) -> int: ...

    def record(self, link: int, attempts: int, successes: int) -> None: ...


class LinkStats:
    """Attempts t' and successes s per link."""

    def __init__(self, n_links: int) -> None:
        self.attempts = np.zeros(n_links, dtype=np.float64)
        self.successes = np.zeros(n_links, dtype=np.float64)

    def record(self, link: int, attempts: int, successes: int) -> tuple[float, float]:
        """Add feedback; returns the link's new (successes, attempts)."""
        if not 0 <= successes <= attempts or attempts < 1:
            msg = f"need 0 <= successes <= attempts and attempts >= 1, got {successes}/{attempts}"
            raise BanditUsageError(msg)
        if not 0 <= link < len(self.attempts):
            msg = f"unknown link {link}"
            raise BanditUsageError(msg)
        self.attempts[link] += attempts
        self.successes[link] += successes
        return float(self.successes[link]), float(self.attempts[link])

    def empirical_theta(self) -> NDArray[np.float64]:
        """θ̂ = s / t' (0 for untried links)."""
        theta = np.zeros_like(self.attempts)
        np.divide(self.successes, self.attempts, out=theta, where=self.attempts > 0)
        return theta


class KlUcbRouting:
    """AgileDART's Algorithm 1: next hop = argmin_w ω(v, w) + J(w), loop-free.

    ``hops`` is the number of links the cost looks at (Fig. 17(c)): ``None`` (all hops)
    uses the full J over the whole graph; ``hops=1`` is ω(v, w) alone, ``hops=2`` adds
    the cheapest link after w, and so on. The hop-limited variants cannot see the sink,
    so like :class:`NextHopRouting` they move only along progress links (fewer hops to
    the sink), which keeps them loop-free and always delivering. (The paper's prose
    calls J over one further link "1 hop"; that is ``hops=2`` here.)
    """

    def __init__(
        self,
        graph: Graph,
        *,
        exploration: float = DEFAULT_EXPLORATION,
        hops: int | None = None,
        name: str | None = None,
    ) -> None:
        exploration_bound(1, exploration)
        if hops is not None and hops < 1:
            msg = f"hops must be None (all) or >= 1, got {hops}"
            raise BanditUsageError(msg)
        self.graph = graph
        self.exploration = exploration
        self.hops = hops
        self.name = name or ("agiledart" if hops is None else f"agiledart-{hops}hop")
        self.stats = LinkStats(graph.n_links)
        self._head = graph.head.tolist()
        self._tail = graph.tail.tolist()
        if hops is None:
            self._allowed = None
            self._out = graph.out_links
        else:
            allowed = progress_links(graph)
            self._allowed = allowed
            self._out = tuple(tuple(k for k in links if allowed[k]) for links in graph.out_links)
        self._bound = 0.0
        self._omega: list[float] = []
        self._j: list[float] = []
        self._stale = [False] * graph.n_nodes  # out-links got feedback since the refresh
        self.begin_packet(1)

    def begin_packet(self, tau: int) -> None:
        """Refresh ω for time index ``tau`` on every link, then J."""
        self._bound = exploration_bound(tau, self.exploration)
        stats = self.stats
        u = kl_ucb_upper(stats.empirical_theta(), stats.attempts, self._bound)
        with np.errstate(divide="ignore"):
            omega = 1.0 / u
        self._omega = omega.tolist()
        self._stale = [False] * self.graph.n_nodes
        if self._allowed is None:
            self._j, _ = costs_to_sink(self.graph, self._omega)
        else:
            assert self.hops is not None
            self._j = lookahead_costs(self.graph, omega, self.hops - 1, self._allowed).tolist()

    def next_link(self, node: int, visited: Container[int]) -> int:
        """The out-link of ``node`` minimising ω + J among unvisited heads."""
        if self._stale[node]:
            self._refresh_links(node)
        best, best_cost = -1, math.inf
        omega, j, head = self._omega, self._j, self._head
        for link in self._out[node]:
            w = head[link]
            if w in visited:
                continue
            cost = omega[link] + j[w]
            if cost < best_cost:
                best, best_cost = link, cost
        if best < 0:
            msg = f"no loop-free next hop from {self.graph.node_ids[node]!r}"
            raise NoRouteError(msg)
        return best

    def record(self, link: int, attempts: int, successes: int) -> None:
        """Update the link's statistics; its ω follows at the current τ, J at τ + 1."""
        self.stats.record(link, attempts, successes)
        self._stale[self._tail[link]] = True

    def _refresh_links(self, node: int) -> None:
        """ω of ``node``'s out-links at the current τ, after feedback (lazily: in a
        loop-free packet's life nobody asks a visited node again)."""
        s, t = self.stats.successes, self.stats.attempts
        for link in self.graph.out_links[node]:
            self._omega[link] = kl_ucb_cost_one(float(s[link]), float(t[link]), self._bound)
        self._stale[node] = False

    @property
    def omega(self) -> NDArray[np.float64]:
        """Current ω per link (a copy)."""
        return np.asarray(self._omega, dtype=np.float64)

    @property
    def cost_to_go(self) -> NDArray[np.float64]:
        """Current J per node (a copy)."""
        return np.asarray(self._j, dtype=np.float64)


class _SourceRouted:
    """A policy that fixes the whole path at the source when a packet starts."""

    name: str

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self._next: dict[int, int] = {}

    def _set_path(self, links: list[int]) -> None:
        tail = self.graph.tail
        self._next = {int(tail[link]): link for link in links}

    @property
    def path(self) -> list[int]:
        """Links of the current packet's path."""
        return list(self._next.values())

    def next_link(self, node: int, visited: Container[int]) -> int:
        try:
            return self._next[node]
        except KeyError:
            msg = f"node {self.graph.node_ids[node]!r} is not on the chosen path"
            raise BanditUsageError(msg) from None


class EndToEndLcbRouting(_SourceRouted):
    """End-to-end routing (Gai et al.'s combinatorial LLR index, for delays).

    Each link keeps its empirical success rate θ̂ over t' attempts; its optimistic
    success rate is min(1, θ̂ + sqrt(alpha · log τ / t')) (1 when untried) and the
    reciprocal of that is a lower confidence bound on its mean delay. The source picks
    the path minimising the sum of these bounds (Dijkstra) and the packet follows it to
    the end. ``alpha = 1.5`` is the usual combinatorial-UCB width; Gai et al.'s
    original LLR uses alpha = L + 1 (L the longest path), which explores far more.
    Feedback is per attempt, the same as AgileDART gets.
    """

    def __init__(self, graph: Graph, *, alpha: float = 1.5, name: str = "end-to-end") -> None:
        if not alpha > 0:
            msg = f"alpha must be > 0, got {alpha}"
            raise BanditUsageError(msg)
        super().__init__(graph)
        self.alpha = alpha
        self.name = name
        self.stats = LinkStats(graph.n_links)
        self.begin_packet(1)

    def begin_packet(self, tau: int) -> None:
        if tau < 1:
            msg = f"time index tau must be >= 1, got {tau}"
            raise BanditUsageError(msg)
        t = self.stats.attempts
        width = np.zeros_like(t)
        np.divide(self.alpha * math.log(tau), t, out=width, where=t > 0)
        ucb = np.where(t > 0, np.minimum(1.0, self.stats.empirical_theta() + np.sqrt(width)), 1.0)
        with np.errstate(divide="ignore"):
            lcb_delay = 1.0 / ucb
        _, succ = costs_to_sink(self.graph, lcb_delay)
        self._set_path(route_from(self.graph, succ, self.graph.source))

    def record(self, link: int, attempts: int, successes: int) -> None:
        self.stats.record(link, attempts, successes)


class OptimalRouting(_SourceRouted):
    """Always p*, the path of least expected delay under the true θ."""

    def __init__(self, graph: Graph, *, name: str = "optimal") -> None:
        super().__init__(graph)
        self.name = name
        self._set_path(optimal_path(graph)[0])

    def begin_packet(self, tau: int) -> None:
        pass

    def record(self, link: int, attempts: int, successes: int) -> None:
        pass


class NextHopRouting:
    """Next-hop routing (Bhorkar et al.): the next link's empirical delay, nothing more.

    At each node the packet takes, among the links that bring it closer to the sink in
    hop count, the one with the lowest empirical mean delay t'/s (attempts per
    success, or t' + 1 before the first success); an untried link counts as delay 0, so
    each is tried once first. There is
    no confidence bonus and no cost-to-go: the greedy choice the paper contrasts with
    AgileDART. Progress links keep it loop-free and always delivering.
    """

    def __init__(self, graph: Graph, *, name: str = "next-hop") -> None:
        self.graph = graph
        self.name = name
        self.stats = LinkStats(graph.n_links)
        allowed = progress_links(graph)
        self._out = tuple(tuple(k for k in links if allowed[k]) for links in graph.out_links)
        self._head = graph.head.tolist()
        self._delay = [0.0] * graph.n_links

    def begin_packet(self, tau: int) -> None:
        pass

    def next_link(self, node: int, visited: Container[int]) -> int:
        best, best_delay = -1, math.inf
        delay, head = self._delay, self._head
        for link in self._out[node]:
            if head[link] in visited:
                continue
            if delay[link] < best_delay:
                best, best_delay = link, delay[link]
        if best < 0:
            msg = f"no progress link from {self.graph.node_ids[node]!r}"
            raise NoRouteError(msg)
        return best

    def record(self, link: int, attempts: int, successes: int) -> None:
        s, t = self.stats.record(link, attempts, successes)
        # With no success yet, t' + 1 attempts is the least the delay can be.
        self._delay[link] = t / s if s > 0 else t + 1.0
