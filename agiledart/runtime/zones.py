"""Zone schedulers, live (paper §VI): the TCP driver around :mod:`agiledart.zones`.

A :class:`ZoneAgent` is the part of a peer that takes part in its zone's scheduling:

* ``submit`` received here: check the spec, run a discovery :class:`~agiledart.zones.Walk`
  (``zone_ask`` to the peers it names, hop by hop), then hand the app to the scheduler
  found (``zone_submit``) or, if none has room within the hop budget, to the peer
  :func:`~agiledart.zones.elect` picks from those met (itself when it is the most
  capable: on a tie the peer nearest the origin wins, which is the origin);
* ``zone_submit`` received here: the authority on this peer's count of apps: refused
  when it is not a scheduler (unless asked to become one) or holds :data:`APP_CAP`;
  else the :class:`~agiledart.runtime.scheduler.Scheduler` schedules the app;
* a gossip loop exchanges scheduler adverts and the zones of peers with a few random
  contacts every ``gossip_interval_s`` (push-pull anti-entropy);
* a scheduler's death: the leaf-set neighbour closest to it (see ``service.py``) elects
  an adopter among the dead peer's zone (``zone_adopt``), which takes its apps over
  from the DHT.

Elections and adoptions write ``scheduler`` trace records and add the peer to the
zone's directory in the DHT (``zone:<name>``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from agiledart.app.errors import AppError
from agiledart.app.parse import Overrides, parse_spec
from agiledart.errors import AgiledartError
from agiledart.overlay.errors import MalformedError, OverlayError
from agiledart.overlay.leafset import Membership, MembershipEvent
from agiledart.overlay.node import OverlayNode
from agiledart.overlay.tcp import ConnectionInfo
from agiledart.runtime.links import Address, Links
from agiledart.runtime.records import Records, record_key
from agiledart.runtime.scheduler import LIVE_STATES, Scheduler
from agiledart.zones import (
    APP_CAP,
    Answer,
    Candidate,
    SchedulerAd,
    Walk,
    ZoneError,
    ZoneView,
    elect,
    estimate_peers,
    hop_budget,
    merge_gossip,
)

if TYPE_CHECKING:
    from agiledart.traces import NullTraceWriter, TraceWriter

log = logging.getLogger(__name__)

__all__ = ["ZoneAgent"]

Handler = Callable[[dict[str, Any], ConnectionInfo], Awaitable[Any]]


class ZoneAgent:
    def __init__(
        self,
        *,
        name: str,
        zone: str,
        overlay: OverlayNode,
        links: Links,
        records: Records,
        scheduler: Scheduler,
        hosted: Callable[[], int],
        trace: TraceWriter | NullTraceWriter,
        cores: int | None = None,
        cap: int = APP_CAP,
        gossip_interval_s: float = 2.0,
        rng: random.Random | None = None,
    ) -> None:
        self.name, self.zone = name, zone
        self.overlay, self.links, self.records = overlay, links, records
        self.scheduler = scheduler
        self.trace = trace
        self.cores = cores or os.cpu_count() or 1
        self.cap = cap
        self.gossip_interval_s = gossip_interval_s
        self.rng = rng or random.Random()
        self._hosted = hosted
        self.view = ZoneView()
        self.zones: dict[str, str] = {name: zone}  #: peer name -> zone, learned by gossip
        self.addresses: dict[str, Address] = {}
        self.is_scheduler = False
        self._reserved = 0
        self.hops: Counter[int] = Counter()  #: discovery hops of apps submitted here
        self.elections = 0
        self._stamp = 0.0
        overlay.subscribe(self._membership)

    # -- what this peer is ----------------------------------------------------------------

    def handlers(self) -> dict[str, Handler]:
        return {
            "zone_ask": self._on_ask,
            "zone_submit": self._on_submit,
            "zone_gossip": self._on_gossip,
            "zone_adopt": self._on_adopt,
        }

    def held(self) -> int:
        """Apps this peer schedules that are still deploying or running."""
        return sum(1 for r in self.scheduler.apps.values() if r.state in LIVE_STATES)

    def capacity(self) -> float:
        """Spare capacity in [0, 1], coarse (tenths) so that small differences in load
        do not outweigh nearness in an election: 32 hosted app instances fill a peer."""
        return round(max(0.0, 1.0 - self._hosted() / 32), 1)

    def ad(self) -> SchedulerAd:
        self._stamp = max(self._stamp + 1e-6, time.time())
        return SchedulerAd(self.name, self.zone, self.held(), self._stamp, self.overlay.address)

    def candidate(self) -> Candidate:
        return Candidate(
            name=self.name,
            zone=self.zone,
            node_id=self.overlay.node_id,
            cores=self.cores,
            capacity=self.capacity(),
            scheduler=self.is_scheduler,
            address=self.overlay.address,
        )

    def answer(self) -> Answer:
        ads = self.view.ads(self.zone)
        if self.is_scheduler:
            ads = [self.ad(), *ads]
        return Answer(self.candidate(), tuple(ads), tuple(self._neighbours()))

    def _neighbours(self) -> list[tuple[str, str]]:
        out = []
        for c in self.overlay.known_peers():
            if c.name and c.failures == 0:
                self.addresses[c.name] = (c.host, c.port)
                out.append((c.name, self.zones.get(c.name, "")))
        return out

    def info(self) -> dict[str, Any]:
        """For ``ring``: this peer's part in its zone's scheduling."""
        return {
            "zone": self.zone,
            "scheduler": self.is_scheduler,
            "apps": self.held(),
            "cap": self.cap,
            "known_schedulers": [
                {"name": a.name, "apps": a.apps} for a in self.view.ads(self.zone)
            ],
            "elections": self.elections,
            "discovery_hops": {str(k): v for k, v in sorted(self.hops.items())},
        }

    def budget(self) -> int:
        leaf = [c.node_id for c in self.overlay.leaf_set.members()]
        n = estimate_peers(
            self.overlay.node_id, leaf, self.overlay.leaf_set.size, len(self.overlay.contacts)
        )
        return hop_budget(n)

    # -- submit at the origin ---------------------------------------------------------------

    async def submit(self, source: Any, overrides: Overrides = ()) -> dict[str, Any]:
        """Find or elect this zone's scheduler and have it schedule the app."""
        received = time.monotonic()
        parse_spec(source, overrides=overrides)  # a bad spec goes no further than here
        walk = Walk(origin=self.name, zone=self.zone, budget=self.budget(), rng=self.rng)
        walk.answer(self.answer())
        while True:
            await self._drive(walk)
            found = walk.result().found
            if found is None:
                break
            self.view.learn([found])
            try:
                res = await self._hand(found.name, found.address, source, overrides, walk)
                return _timed(res, received)
            except _Refused as refused:
                if refused.ad is not None:
                    self.view.learn([refused.ad])
                else:
                    self.view.forget(found.name)
                walk.refused(found.name)
        met = walk.result().met
        chosen = elect(met.values(), self.zone, near=self.overlay.node_id)
        if chosen is None or chosen.name == self.name:
            chosen = self.candidate()
        try:
            res = await self._hand(chosen.name, chosen.address, source, overrides, walk, elect=True)
        except _Refused:  # the elected peer filled up meanwhile: the origin serves
            res = await self.serve(source, overrides, elect=True, hops=walk.hop, force=True)
        return _timed(res, received)

    async def _drive(self, walk: Walk) -> None:
        while not walk.done:
            asks = walk.asks()
            replies = await asyncio.gather(*(self._ask(n) for n in asks))
            for name, reply in zip(asks, replies, strict=True):
                if reply is None:
                    walk.no_answer(name)
                else:
                    walk.answer(reply)
            walk.next_hop()

    def _address(self, name: str) -> Address | None:
        for c in self.overlay.known_peers():
            if c.name == name:
                return (c.host, c.port)
        return self.addresses.get(name)

    async def _ask(self, name: str) -> Answer | None:
        address = self._address(name)
        if address is None:
            return None
        body = {"from": self.name, "zone": self.zone}
        try:
            raw = await self.links.request(address, "zone_ask", body, timeout=3.0)
            answer = _answer_from_wire(raw)
        except AgiledartError as exc:
            log.debug("zone_ask to %s failed: %s", name, exc)
            return None
        self._learn_answer(answer, raw)
        return answer

    def _learn_answer(self, answer: Answer, raw: Any) -> None:
        self.zones[answer.peer.name] = answer.peer.zone
        for entry in raw.get("addresses", ()):
            try:
                self.addresses.setdefault(str(entry[0]), (str(entry[1]), int(entry[2])))
            except (TypeError, ValueError, IndexError):
                continue
        for n, z in answer.neighbours:
            if z:
                self.zones.setdefault(n, z)
        self.view.learn(a for a in answer.ads if a.zone == self.zone)

    async def _hand(
        self,
        name: str,
        address: Address | None,
        source: Any,
        overrides: Overrides,
        walk: Walk,
        *,
        elect: bool = False,
    ) -> dict[str, Any]:
        """Have ``name`` schedule the app; :class:`_Refused` if it will not."""
        hops = walk.hop
        if name == self.name:
            return await self.serve(source, overrides, elect=elect, hops=hops)
        address = address or self._address(name)
        if address is None:
            raise _Refused(None)
        body = {
            "spec": source,
            "set": list(overrides),
            "zone": self.zone,
            "elect": elect,
            "hops": hops,
        }
        try:
            res = await self.links.request(address, "zone_submit", body, timeout=120.0)
        except OverlayError as exc:
            if exc.remote_peer is not None:
                raise  # the scheduler failed the app: its error stands, in its own type
            log.info("scheduler %s unreachable (%s): looking further", name, exc)
            raise _Refused(None) from None
        if not isinstance(res, dict):
            msg = "zone_submit answered something that is not a map"
            raise MalformedError(msg)
        if res.get("refused"):
            try:
                ad = SchedulerAd.from_wire(res.get("ad"))
            except ZoneError:
                ad = None
            raise _Refused(ad)
        return res

    # -- the scheduler's side ----------------------------------------------------------------

    async def serve(
        self, source: Any, overrides: Overrides, *, elect: bool, hops: int, force: bool = False
    ) -> dict[str, Any]:
        """Schedule an app here if this peer may (``force``: even beyond the cap, the
        last resort when every peer met is a full scheduler)."""
        if not self.is_scheduler:
            if not elect:
                raise _Refused(self.ad())
            await self.become_scheduler("elected")
        if self.held() + self._reserved >= self.cap and not force:
            raise _Refused(self.ad())
        self._reserved += 1
        started = time.monotonic()
        try:
            rec = await self.scheduler.submit(source, overrides)
        finally:
            self._reserved -= 1
        self.hops[hops] += 1
        return {
            "app_id": rec.app_id,
            "state": rec.state,
            "placement": rec.placement,
            "warnings": self.scheduler.warnings(rec),
            "scheduler": self.name,
            "scheduler_hops": hops,
            "elected": elect,
            "deploy_ms": round((time.monotonic() - started) * 1000, 3),
        }

    async def become_scheduler(self, event: str) -> None:
        """Start scheduling for this zone: directory entry, trace, adverts out."""
        if not self.is_scheduler:
            self.is_scheduler = True
            self.elections += 1
            log.info("%s is now a scheduler of zone %s (%s)", self.name, self.zone, event)
        self.trace.emit(
            "scheduler", zone=self.zone, scheduler=self.name, event=event, apps=self.held()
        )
        try:
            await self.records.add(record_key("zone", self.zone), self.name)
        except AgiledartError as exc:
            log.warning("zone directory not updated: %s", exc)
        await self._gossip_round(fanout=8)

    async def _on_submit(self, req: dict[str, Any], conn: ConnectionInfo) -> dict[str, Any]:
        source, overrides = req.get("spec"), req.get("set") or []
        hops = req.get("hops", 0)
        if not isinstance(source, str | dict) or not isinstance(overrides, list):
            msg = "zone_submit needs 'spec' and 'set'"
            raise MalformedError(msg)
        if req.get("zone") != self.zone:
            return {"refused": True, "ad": self.ad().to_wire()}
        try:
            return await self.serve(
                source,
                [str(o) for o in overrides],
                elect=bool(req.get("elect")),
                hops=hops if type(hops) is int else 0,
            )
        except _Refused as refused:
            return {"refused": True, "ad": None if refused.ad is None else refused.ad.to_wire()}

    async def _on_ask(self, req: dict[str, Any], conn: ConnectionInfo) -> dict[str, Any]:
        asker, zone = req.get("from"), req.get("zone")
        if isinstance(asker, str) and isinstance(zone, str) and asker:
            self.zones[asker] = zone
        answer = self.answer()
        return _answer_to_wire(answer, self.addresses)

    # -- gossip -----------------------------------------------------------------------------

    async def gossip_loop(self) -> None:
        while True:
            await asyncio.sleep(self.gossip_interval_s * (0.75 + 0.5 * self.rng.random()))
            await self._gossip_round(fanout=2)

    async def _gossip_round(self, *, fanout: int) -> None:
        peers = [c for c in self.overlay.known_peers() if c.name and c.failures == 0]
        picks = self.rng.sample(peers, min(fanout, len(peers)))
        await asyncio.gather(*(self._gossip_with((c.host, c.port)) for c in picks))

    def _gossip_body(self) -> dict[str, Any]:
        ads = self.view.ads()
        if self.is_scheduler:
            ads = [self.ad(), *ads]
        sample = self.rng.sample(sorted(self.zones.items()), min(64, len(self.zones)))
        return {
            "from": self.name,
            "zone": self.zone,
            "ads": [a.to_wire() for a in ads[:32]],
            "zones": [list(e) for e in sample],
        }

    async def _gossip_with(self, address: Address) -> None:
        try:
            raw = await self.links.request(address, "zone_gossip", self._gossip_body(), timeout=3.0)
        except AgiledartError as exc:
            log.debug("zone gossip with %s failed: %s", address, exc)
            return
        merge_gossip(raw, me=self.name, view=self.view, zones=self.zones)

    async def _on_gossip(self, req: dict[str, Any], conn: ConnectionInfo) -> dict[str, Any]:
        merge_gossip(req, me=self.name, view=self.view, zones=self.zones)
        return self._gossip_body()

    # -- a scheduler died ---------------------------------------------------------------------

    def _membership(self, event: MembershipEvent) -> None:
        if event.kind is Membership.DEAD and event.contact.name:
            self.view.forget(event.contact.name)

    async def adopt(self, dead: str) -> None:
        """This peer is ``dead``'s closest neighbour: have the most capable peer of the
        dead one's zone that answers adopt its apps (this one if it is the best)."""
        ids = await self._scheduled_by(dead)
        if not ids:
            return
        zone = self.zones.get(dead, self.zone)
        members = [n for n, z in self.zones.items() if z == zone and n not in (dead, self.name)][
            :16
        ]
        replies = await asyncio.gather(*(self._ask(n) for n in members))
        met = [r.peer for r in replies if r is not None]
        if zone == self.zone:
            met.append(self.candidate())
        # adopting does not need a fresh scheduler: schedulers with room compete too
        pool = [
            Candidate(c.name, c.zone, c.node_id, c.cores, c.capacity, False, c.alive, c.address)
            for c in met
        ]
        dead_id = next((c.node_id for c in self.overlay.known_peers() if c.name == dead), 0)
        chosen = elect(pool, zone, near=dead_id)
        if chosen is not None and chosen.name != self.name and chosen.address is not None:
            try:
                await self.links.request(chosen.address, "zone_adopt", {"dead": dead}, timeout=60)
                return
            except AgiledartError as exc:
                log.warning(
                    "%s did not adopt %s's apps (%s): adopting here", chosen.name, dead, exc
                )
        await self.adopt_here(dead)

    async def adopt_here(self, dead: str) -> None:
        await self.scheduler.adopt_from(dead)
        if any(r.scheduler_name == self.name for r in self.scheduler.apps.values()):
            await self.become_scheduler("adopted")

    async def _scheduled_by(self, dead: str) -> list[str]:
        try:
            ids = await self.records.get(record_key("scheduling", dead))
        except AgiledartError:
            return []
        return [str(i) for i in ids] if isinstance(ids, list) else []

    async def _on_adopt(self, req: dict[str, Any], conn: ConnectionInfo) -> bool:
        dead = req.get("dead")
        if not isinstance(dead, str) or not dead:
            msg = "zone_adopt needs 'dead': a peer name"
            raise MalformedError(msg)
        await self.adopt_here(dead)
        return True


def _timed(res: dict[str, Any], received: float) -> dict[str, Any]:
    """The scheduler's answer with the time before it started deploying (discovery,
    hand-over) as ``queue_ms``."""
    total = (time.monotonic() - received) * 1000
    return {**res, "queue_ms": round(max(0.0, total - float(res.get("deploy_ms", 0.0))), 3)}


class _Refused(AppError):
    """A scheduler will not take this app (full, or not one); ``ad`` is its advert."""

    def __init__(self, ad: SchedulerAd | None) -> None:
        super().__init__("refused")
        self.ad = ad


def _answer_to_wire(answer: Answer, addresses: dict[str, Address]) -> dict[str, Any]:
    p = answer.peer
    return {
        "peer": [
            p.name,
            p.zone,
            f"{p.node_id:040x}",
            p.cores,
            p.capacity,
            p.scheduler,
            None if p.address is None else list(p.address),
        ],
        "ads": [a.to_wire() for a in answer.ads],
        "neighbours": [list(n) for n in answer.neighbours],
        "addresses": [[n, *addresses[n]] for n, _ in answer.neighbours if n in addresses],
    }


def _answer_from_wire(raw: Any) -> Answer:
    try:
        name, zone, node_id, cores, capacity, scheduler, addr = raw["peer"]
        peer = Candidate(
            name=str(name),
            zone=str(zone),
            node_id=int(node_id, 16),
            cores=int(cores),
            capacity=float(capacity),
            scheduler=bool(scheduler),
            address=None if addr is None else (str(addr[0]), int(addr[1])),
        )
        ads = tuple(SchedulerAd.from_wire(a) for a in raw["ads"][:64])
        neighbours = tuple((str(n), str(z)) for n, z in raw["neighbours"][:512])
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        msg = f"malformed zone answer: {type(exc).__name__}: {exc}"
        raise ZoneError(msg) from None
    return Answer(peer, ads, neighbours)
