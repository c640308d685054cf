"""Algorithm 1 as one relay peer runs it (paper §V-B): the per-hop decision API.

A relay v forwarding toward one destination knows only its own out-links and what
its neighbours tell it. :class:`HopPlanner` holds exactly that:

* per neighbour w, the statistics of link (v, w): attempts t' and successes s, fed by
  :meth:`HopPlanner.record` after every transmission attempt (or in batches);
* per neighbour w, the cost-to-go J(w) that w advertised (:meth:`HopPlanner.advertise`;
  the destination itself advertises 0, an unknown or withdrawn route is +inf).

From these it picks the next hop, argmin_w ω(v, w) + J(w) over neighbours not on the
packet's path (:meth:`HopPlanner.choose`), and computes its own J(v) = min_w ω(v, w)
+ J(w) to advertise upstream (:meth:`HopPlanner.cost_to_go`): a distributed
Bellman-Ford whose fixed point is the J that :func:`agiledart.bandit.paths.costs_to_sink`
computes centrally. Everything is incremental: feedback recomputes one link's ω, an
advertisement replaces one number, a decision is a loop over the out-links.

τ, the time index of the bound C log τ, is the driver's: the packet's sequence number
at its source (carried in the packet) matches the paper and the simulator; a relay's
own count of packets forwarded toward this destination also works, log τ moving
slowly. ω is cached per τ and recomputed for all out-links when τ changes (a few
microseconds per link).

No I/O, no clock, no randomness: ties go to the neighbour added first.
"""

from __future__ import annotations

import math
from collections.abc import Container, Hashable, Iterable
from dataclasses import dataclass

from agiledart.bandit.errors import AdvertisementError, BanditUsageError, NoRouteError
from agiledart.bandit.klucb import exploration_bound, kl_ucb_cost_one
from agiledart.bandit.policies import DEFAULT_EXPLORATION

__all__ = ["HopPlanner", "LinkState"]


@dataclass(frozen=True, slots=True)
class LinkState:
    """One out-link as the relay sees it."""

    neighbour: Hashable
    attempts: int
    successes: int
    cost_to_go: float
    """J advertised by the neighbour."""


class HopPlanner:
    """Next-hop choice at one relay toward one destination."""

    def __init__(
        self, neighbours: Iterable[Hashable] = (), *, exploration: float = DEFAULT_EXPLORATION
    ) -> None:
        exploration_bound(1, exploration)
        self.exploration = exploration
        self._names: list[Hashable] = []
        self._slot: dict[Hashable, int] = {}
        self._attempts: list[int] = []
        self._successes: list[int] = []
        self._j: list[float] = []
        self._omega: list[float] = []
        self._tau: int | None = None  # τ that ω is valid for
        self._bound = 0.0
        self._stale: set[int] = set()
        for neighbour in neighbours:
            self.add_neighbour(neighbour)

    @property
    def neighbours(self) -> tuple[Hashable, ...]:
        return tuple(self._names)

    def add_neighbour(self, neighbour: Hashable, *, cost_to_go: float = math.inf) -> None:
        """A new out-link, untried (ω = 1), with the neighbour's J if already known."""
        if neighbour in self._slot:
            msg = f"neighbour {neighbour!r} is already known"
            raise BanditUsageError(msg)
        self._slot[neighbour] = len(self._names)
        self._names.append(neighbour)
        self._attempts.append(0)
        self._successes.append(0)
        self._j.append(_checked(neighbour, cost_to_go))
        self._omega.append(1.0)

    def remove_neighbour(self, neighbour: Hashable) -> None:
        """Forget an out-link (the neighbour left); its statistics go with it."""
        i = self._index(neighbour)
        for column in (self._names, self._attempts, self._successes, self._j, self._omega):
            del column[i]
        self._slot = {name: k for k, name in enumerate(self._names)}
        self._stale = {k - (k > i) for k in self._stale if k != i}

    def advertise(self, neighbour: Hashable, cost_to_go: float) -> None:
        """Neighbour ``neighbour`` says its J is ``cost_to_go`` (+inf: no route)."""
        self._j[self._index(neighbour)] = _checked(neighbour, cost_to_go)

    def record(self, neighbour: Hashable, success: bool) -> None:
        """Feedback of one transmission attempt on the link to ``neighbour``."""
        self.record_attempts(neighbour, 1, 1 if success else 0)

    def record_attempts(self, neighbour: Hashable, attempts: int, successes: int) -> None:
        """Feedback of several attempts at once."""
        if not 0 <= successes <= attempts or attempts < 1:
            msg = f"need 0 <= successes <= attempts and attempts >= 1, got {successes}/{attempts}"
            raise BanditUsageError(msg)
        i = self._index(neighbour)
        self._attempts[i] += attempts
        self._successes[i] += successes
        self._stale.add(i)

    def choose(self, tau: int, exclude: Container[Hashable] = ()) -> Hashable:
        """The neighbour minimising ω + J, skipping ``exclude`` (the packet's path)."""
        best, best_cost = -1, math.inf
        for i, cost in enumerate(self._costs(tau)):
            if cost < best_cost and self._names[i] not in exclude:
                best, best_cost = i, cost
        if best < 0:
            msg = "no neighbour with a route to the destination off the packet's path"
            raise NoRouteError(msg)
        return self._names[best]

    def cost_to_go(self, tau: int, exclude: Container[Hashable] = ()) -> float:
        """J(v) = min_w ω(v, w) + J(w), to advertise upstream (+inf: no route).

        ``exclude`` lets a caller leave out the neighbour it advertises to (split
        horizon).
        """
        costs = self._costs(tau)
        return min(
            (c for name, c in zip(self._names, costs, strict=True) if name not in exclude),
            default=math.inf,
        )

    def link_cost(self, neighbour: Hashable, tau: int) -> float:
        """ω(v, neighbour) at ``tau``."""
        i = self._index(neighbour)
        self._costs(tau)
        return self._omega[i]

    def links(self) -> list[LinkState]:
        """What the relay knows, per out-link (for traces and status)."""
        return [
            LinkState(name, t, s, j)
            for name, t, s, j in zip(
                self._names, self._attempts, self._successes, self._j, strict=True
            )
        ]

    def _costs(self, tau: int) -> list[float]:
        if tau != self._tau:
            self._bound = exploration_bound(tau, self.exploration)
            self._tau = tau
            self._stale = set(range(len(self._names)))
        if self._stale:
            s, t, bound = self._successes, self._attempts, self._bound
            for i in self._stale:
                self._omega[i] = kl_ucb_cost_one(s[i], t[i], bound)
            self._stale.clear()
        return [w + j for w, j in zip(self._omega, self._j, strict=True)]

    def _index(self, neighbour: Hashable) -> int:
        try:
            return self._slot[neighbour]
        except KeyError:
            msg = f"unknown neighbour {neighbour!r}"
            raise BanditUsageError(msg) from None


def _checked(neighbour: Hashable, cost_to_go: float) -> float:
    if (
        isinstance(cost_to_go, bool)
        or not isinstance(cost_to_go, int | float)
        or math.isnan(cost_to_go)
        or cost_to_go < 0
    ):
        msg = f"neighbour {neighbour!r} advertised cost-to-go {cost_to_go!r}; need >= 0 or inf"
        raise AdvertisementError(msg)
    return float(cost_to_go)
