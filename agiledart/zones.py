"""Zone schedulers (paper §VI, §VII-E): discovery by gossip, election, the app cap.

Theory of operation
-------------------
Peers carry a *zone* (a site, a region). Any peer may schedule apps; the ones that do
are the zone's *schedulers*. When an app is submitted at a peer of zone Z:

1. **Discovery** (:class:`Walk`): a gossip walk looks for a scheduler of Z with room.
   Hop 0 is the submitting peer's own knowledge (:class:`ZoneView`: the scheduler
   adverts it has heard by gossip). Each further hop asks up to ``fanout`` not yet
   asked contacts of every peer asked at the hop before, those known to be in Z first
   (then of unknown zone; peers of other zones are not asked). Every peer asked
   answers with itself (zone, capacity, whether it schedules) and the adverts it
   knows. The walk ends at the first hop where some answer names a scheduler of Z with
   room, and after at most ``ceil(log_{2^b} N)`` hops (b = 4, :func:`hop_budget`):
   Pastry's routing bound, which the paper uses as the gossip horizon.
2. **Cap**: a scheduler takes at most :data:`APP_CAP` (50) apps. It is the authority
   on its count: registering with a full one is refused, and the walk goes on
   (:meth:`Walk.refused`).
3. **Election** (:func:`elect`): nothing found within the budget, or only full
   schedulers: the most capable peer the walk met in Z becomes a new scheduler.
   Capable: alive, in Z, not scheduling already, some spare capacity. Most capable:
   most cores (the paper's "powerful computing resources"), then most spare capacity,
   then nearest the submitting peer in the id space (XOR), then name: deterministic.

Scheduler state lives in the DHT (each app's record names its scheduler; a
scheduler's apps are listed under ``scheduling:<name>``), so when a scheduler dies its
apps keep running and a peer of its zone adopts them (:func:`elect` again, over the
dead one's zone). Everything here is a plain object over values: the live driver
(:mod:`agiledart.runtime.zones`) asks peers over TCP frames, the large-scale
simulation (:mod:`agiledart.largescale`) calls the peers' objects directly.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agiledart.errors import AgiledartError

__all__ = [
    "APP_CAP",
    "DIGIT_BITS",
    "Answer",
    "Candidate",
    "Discovery",
    "SchedulerAd",
    "Walk",
    "ZoneError",
    "ZoneView",
    "capable",
    "drive",
    "elect",
    "estimate_peers",
    "hop_budget",
    "merge_gossip",
]

#: apps one scheduler takes before another is elected (paper §VII-E)
APP_CAP = 50
#: b: bits per routing digit (Pastry's b = 4, so hops are ceil(log_16 N))
DIGIT_BITS = 4
#: contacts each asked peer passes the walk on to
DEFAULT_FANOUT = 3


class ZoneError(AgiledartError):
    """A zone message is malformed or a zone request cannot be served."""


def hop_budget(peers: int, b: int = DIGIT_BITS) -> int:
    """``ceil(log_{2^b} N)``, at least 1: the hops a discovery walk may take."""
    if peers < 1 or b < 1:
        msg = f"hop budget needs N >= 1 and b >= 1, got N={peers}, b={b}"
        raise ZoneError(msg)
    if peers == 1:
        return 1
    # exact for powers of 2^b, where floating-point log might land a hair above
    hops, reach = 0, 1
    while reach < peers:
        reach <<= b
        hops += 1
    return max(1, hops)


def estimate_peers(own_id: int, leaf_ids: Sequence[int], leaf_size: int, known: int) -> int:
    """The ring's size as one peer sees it: everyone it knows while its leaf set is not
    full (a small ring); else from the leaf set's density, since the L closest ids of
    N uniform ones span about L / N of the id space."""
    if len(leaf_ids) < leaf_size or not leaf_ids:
        return max(1, known + 1)
    span = max(i ^ own_id for i in leaf_ids)
    dense = round(len(leaf_ids) * (1 << 160) / max(1, span))
    return max(known + 1, dense)


@dataclass(frozen=True, slots=True)
class SchedulerAd:
    """A scheduler's advert, spread by gossip: who, where, how many apps, when said."""

    name: str
    zone: str
    apps: int
    stamp: float  #: the scheduler's clock when it said so: newer adverts win
    address: tuple[str, int] | None = None

    def has_room(self, cap: int = APP_CAP) -> bool:
        return self.apps < cap

    def to_wire(self) -> list[Any]:
        addr = None if self.address is None else list(self.address)
        return [self.name, self.zone, self.apps, self.stamp, addr]

    @classmethod
    def from_wire(cls, raw: Any) -> SchedulerAd:
        try:
            name, zone, apps, stamp, addr = raw
            if not (isinstance(name, str) and name and isinstance(zone, str)):
                raise TypeError("name and zone must be strings")  # noqa: EM101
            if type(apps) is not int or apps < 0 or not isinstance(stamp, int | float):
                raise TypeError("apps must be a count, stamp a number")  # noqa: EM101
            address = None if addr is None else (str(addr[0]), int(addr[1]))
        except (TypeError, ValueError, IndexError) as exc:
            msg = f"malformed scheduler advert: {exc}"
            raise ZoneError(msg) from None
        return cls(name, zone, apps, float(stamp), address)


class ZoneView:
    """The scheduler adverts one peer has heard, newest per scheduler, bounded."""

    def __init__(self, *, limit: int = 256) -> None:
        self.limit = limit
        self._ads: dict[str, SchedulerAd] = {}

    def __len__(self) -> int:
        return len(self._ads)

    def learn(self, ads: Iterable[SchedulerAd]) -> bool:
        """Take newer adverts; whether anything changed."""
        changed = False
        for ad in ads:
            old = self._ads.get(ad.name)
            if old is None or ad.stamp > old.stamp:
                self._ads[ad.name] = ad
                changed = True
        while len(self._ads) > self.limit:  # forget the stalest
            del self._ads[min(self._ads.values(), key=lambda a: a.stamp).name]
        return changed

    def forget(self, name: str) -> None:
        self._ads.pop(name, None)

    def get(self, name: str) -> SchedulerAd | None:
        return self._ads.get(name)

    def ads(self, zone: str | None = None) -> list[SchedulerAd]:
        """Adverts (of ``zone``), fewest apps first, then by name."""
        out = [a for a in self._ads.values() if zone is None or a.zone == zone]
        return sorted(out, key=lambda a: (a.apps, a.name))

    def with_room(self, zone: str, cap: int = APP_CAP) -> list[SchedulerAd]:
        return [a for a in self.ads(zone) if a.has_room(cap)]


def merge_gossip(raw: Any, *, me: str, view: ZoneView, zones: dict[str, str]) -> None:
    """Take what one gossip message (``zone_gossip``, asked or answered) tells: its
    sender's zone, the scheduler adverts it carries (up to 64; ours and malformed ones
    left out) and up to 128 more peers' zones, which never override what we know."""
    if not isinstance(raw, dict):
        return
    sender, zone = raw.get("from"), raw.get("zone")
    if isinstance(sender, str) and isinstance(zone, str) and sender:
        zones[sender] = zone
    ads = []
    for wire in raw.get("ads", ())[:64] if isinstance(raw.get("ads"), list) else ():
        try:
            ad = SchedulerAd.from_wire(wire)
        except ZoneError:
            continue
        if ad.name != me:
            ads.append(ad)
    view.learn(ads)
    entries = raw.get("zones")
    for entry in entries[:128] if isinstance(entries, list) else ():
        if isinstance(entry, list) and len(entry) == 2 and all(isinstance(x, str) for x in entry):
            zones.setdefault(entry[0], entry[1])


@dataclass(frozen=True, slots=True)
class Candidate:
    """A peer as the walk met it: what election looks at."""

    name: str
    zone: str
    node_id: int = 0
    cores: int = 1
    capacity: float = 1.0  #: spare capacity in [0, 1]
    scheduler: bool = False  #: schedules apps already
    alive: bool = True
    address: tuple[str, int] | None = None


@dataclass(frozen=True, slots=True)
class Answer:
    """What a peer answers a walk: itself, the adverts it knows, contacts to go on to
    as ``(name, zone)`` pairs (zone "" when it does not know theirs)."""

    peer: Candidate
    ads: tuple[SchedulerAd, ...] = ()
    neighbours: tuple[tuple[str, str], ...] = ()


def capable(c: Candidate, zone: str) -> bool:
    return c.alive and c.zone == zone and not c.scheduler and c.capacity > 0.0


def elect(candidates: Iterable[Candidate], zone: str, *, near: int = 0) -> Candidate | None:
    """The most capable candidate of ``zone`` (see the module notes), or None."""
    best: Candidate | None = None
    best_key: tuple[int, float, int, str] | None = None
    for c in candidates:
        if not capable(c, zone):
            continue
        key = (-c.cores, -c.capacity, c.node_id ^ near, c.name)
        if best_key is None or key < best_key:
            best, best_key = c, key
    return best


@dataclass(frozen=True, slots=True)
class Discovery:
    """How a walk ended: the scheduler found (None: elect), the hops it took, the
    peers it met (the electorate), how many peers it asked."""

    found: SchedulerAd | None
    hops: int
    met: Mapping[str, Candidate]
    asked: int


@dataclass
class Walk:
    """One discovery walk, without I/O: feed it answers, it says whom to ask next.

    ``walk = Walk(origin=..., zone=..., budget=hop_budget(n), rng=rng)``;
    ``walk.answer(origin's own answer)``; then while ``walk.asks()`` is not empty,
    send each peer listed the query and ``walk.answer(...)`` each reply (a peer that
    does not answer: :meth:`no_answer`), then :meth:`next_hop`. ``walk.result()``
    when :attr:`done`.
    """

    origin: str
    zone: str
    budget: int
    rng: random.Random
    fanout: int = DEFAULT_FANOUT
    cap: int = APP_CAP
    hop: int = 0
    met: dict[str, Candidate] = field(default_factory=dict)
    asked: set[str] = field(default_factory=set)
    _ads: dict[str, SchedulerAd] = field(default_factory=dict)
    _full: set[str] = field(default_factory=set)
    _pending: list[str] = field(default_factory=list)
    _answers: list[Answer] = field(default_factory=list)
    _found: SchedulerAd | None = None
    _exhausted: bool = False

    def __post_init__(self) -> None:
        if self.budget < 0 or self.fanout < 1 or self.cap < 1:
            msg = f"walk needs budget >= 0, fanout >= 1, cap >= 1 (got {self}"
            raise ZoneError(msg + ")")
        self.asked.add(self.origin)

    @property
    def done(self) -> bool:
        return self._found is not None or self._exhausted

    def answer(self, answer: Answer) -> None:
        """A reply to the walk (the origin's own first, at hop 0)."""
        self._answers.append(answer)
        self.met[answer.peer.name] = answer.peer
        for ad in answer.ads:
            old = self._ads.get(ad.name)
            if ad.zone == self.zone and (old is None or ad.stamp > old.stamp):
                self._ads[ad.name] = ad
        if self.hop == 0 and answer.peer.name == self.origin:
            self._settle()

    def no_answer(self, name: str) -> None:
        self.met.pop(name, None)

    def refused(self, name: str) -> None:
        """The scheduler found is full after all: go on looking (hops permitting)."""
        self._full.add(name)
        self._found = None
        self._settle()

    def asks(self) -> list[str]:
        """Peers to ask at the current hop (empty: the walk is done)."""
        return [] if self.done else list(self._pending)

    def next_hop(self) -> None:
        """Every ask of this hop answered (or given up): look at what came back."""
        self._settle()

    def result(self) -> Discovery:
        return Discovery(self._found, self.hop, dict(self.met), len(self.asked) - 1)

    # -- internals -------------------------------------------------------------------

    def _best(self) -> SchedulerAd | None:
        room = [a for a in self._ads.values() if a.has_room(self.cap) and a.name not in self._full]
        return min(room, key=lambda a: (a.apps, a.name)) if room else None

    def _settle(self) -> None:
        self._found = self._best()
        if self._found is not None:
            return
        if self.hop >= self.budget:
            self._exhausted = True
            return
        nxt = self._frontier()
        self._answers = []
        if not nxt:
            self._exhausted = True
            self._pending = []
            return
        self.hop += 1
        self._pending = nxt
        self.asked.update(nxt)

    def _frontier(self) -> list[str]:
        """Up to ``fanout`` unasked contacts of each peer answered at this hop: known
        zone members first, then peers of unknown zone, each group shuffled."""
        out: list[str] = []
        chosen: set[str] = set()
        for answer in self._answers:
            same = [n for n, z in answer.neighbours if z == self.zone]
            unknown = [n for n, z in answer.neighbours if not z]
            self.rng.shuffle(same)
            self.rng.shuffle(unknown)
            picked = 0
            for name in same + unknown:
                if picked >= self.fanout:
                    break
                if name in self.asked or name in chosen:
                    continue
                chosen.add(name)
                out.append(name)
                picked += 1
        return out


def drive(walk: Walk, ask: Callable[[str], Answer | None]) -> Discovery:
    """Run ``walk`` to its end with a synchronous ``ask`` (None: no answer); the
    origin's own answer must have been given already."""
    while not walk.done:
        for name in walk.asks():
            got = ask(name)
            if got is None:
                walk.no_answer(name)
            else:
                walk.answer(got)
        walk.next_hop()
    return walk.result()
