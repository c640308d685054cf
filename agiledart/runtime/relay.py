"""Relaying data over an emulated network, next hop by next hop (paper §V, Algorithm 1).

When the peer runs with a link model (:mod:`agiledart.runtime.linkmodel`), every data
batch and watermark from an operator here to one on another covered peer is a *packet*
that this module carries to its destination over the model's links, relay by relay.

* **Custody, hop by hop.** The origin, and then each relay, owns the packet until the
  next hop acknowledges it. One *attempt* sends the packet to a neighbour ``w`` chosen
  by :class:`~agiledart.bandit.relay.HopPlanner` (argmin ω(v, w) + J(w) over neighbours
  not yet on the packet's path) and waits one slot plus an acknowledgement timeout
  (:class:`AckTimer`: TCP's SRTT + 4 RTTVAR over that neighbour's acknowledgement
  delays, 10 ms to ``ack_grace_ms`` = 100 ms, doubled after a timeout).
  One not acknowledged in time is a failed attempt, fed back to the planner, and the
  packet is tried again, possibly elsewhere. Nothing is lost while its holder lives, and
  nothing when a relay dies holding it either: the origin keeps every packet until the
  destination confirms it (``relay_done``, straight back, cumulative per flow). A flow
  whose confirmations made no progress for :data:`RESEND_AFTER_S` (doubling to
  :data:`RESEND_MAX_S` while none comes) has its oldest unconfirmed packets (at most
  :data:`RESEND_BURST`) sent again, as TCP retransmits the first unacknowledged segment:
  a lost one holds up its whole flow at the destination, and sending everything again
  would flood a network already slow. A late acknowledgement makes a copy. The
  destination drops copies (by packet id, then flow sequence); a relay that still holds
  the packet when a copy comes takes it off the sender's hands ("ok") only if its name
  is the smaller one, and refuses it otherwise (the sender tries elsewhere); a relay
  that passed it on before carries the copy on like a new packet. Answering "seen" to
  every copy lost packets: when two holders A and B sent each other their copies, both
  let go. With the rule, every copy given up goes to a holder with a smaller name, so
  custody cannot go round in a circle and someone always holds the packet.
* **The emulated link.** The receiving end of ``v -> w`` throws an arriving attempt
  away with probability 1 - θ(v, w) (no acknowledgement: the sender cannot tell a lost
  packet from a slow link); a packet that gets through is acknowledged at once and
  handled one slot later, so a hop takes ``slot_ms`` per attempt, as in the model and
  the regret simulator.
* **Learning.** Acknowledgements carry the receiver's J toward the destination (0 at
  the destination; split horizon: the receiver leaves out the link back to the
  sender), so J values spread upstream distance-vector style as packets flow. Before
  any feedback J is the hop count in the model (every untried link costs 1).
* **Order.** The destination hands each flow's packets (one flow per sending operator
  edge) to the app in the origin's order, holding early ones back: a watermark never
  overtakes the batches sent before it. Credits (flow control) go straight back to the
  origin; the link model applies to data, not to control traffic.

Traces: one ``shuffle`` record per attempt and one ``delivery`` record per packet at its
destination (``agiledart.traces.schema``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import random
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field
from typing import Any, Protocol

from agiledart.bandit.errors import NoRouteError
from agiledart.bandit.policies import DEFAULT_EXPLORATION
from agiledart.bandit.relay import HopPlanner
from agiledart.errors import AgiledartError
from agiledart.overlay.errors import MalformedError, OverlayError
from agiledart.overlay.tcp import ConnectionInfo
from agiledart.runtime.linkmodel import LinkModel
from agiledart.runtime.links import Address, Links

__all__ = ["AckTimer", "Relay", "RelayStatistics"]

log = logging.getLogger("agiledart.relay")

POLICY = "kl-ucb"
SEEN_MAX = 100_000  #: packet ids remembered per peer for duplicate detection
NO_ROUTE_WAIT_S = 0.05
RESEND_AFTER_S = 5.0  #: a flow without confirmed progress for this long is sent again
RESEND_MAX_S = 60.0  #: the longest wait between two sends again of one flow
RESEND_BURST = 8  #: the oldest unconfirmed packets of a flow sent again at once
RESEND_CHECK_S = 0.5  #: how often the origin looks for flows to send again


class Tracer(Protocol):
    def emit(self, type: str, **fields: Any) -> None: ...


#: deliver(kind, body, origin name, origin address): hands a packet to the app here
Deliver = Callable[[str, dict[str, Any], str, Address], Awaitable[None]]
Resolve = Callable[[str], Awaitable[Address | None]]


@dataclass
class RelayStatistics:
    sent: int = 0  #: packets this peer originated
    delivered: int = 0  #: packets delivered to apps here
    forwarded: int = 0  #: packets relayed for others
    attempts: int = 0
    failures: int = 0  #: attempts not acknowledged in time
    refused: int = 0
    lost_here: int = 0  #: arriving attempts the emulated link threw away
    duplicates: int = 0
    late_acks: int = 0
    resent: int = 0  #: packets sent again, unconfirmed by their destination in time
    unconfirmed: int = 0  #: packets originated here that their destination has not confirmed


class AckTimer:
    """How long, beyond the slot, to wait for one neighbour's acknowledgement.

    RFC 6298's retransmission timeout: SRTT + 4 RTTVAR over the delays of the
    acknowledgements that came (each attempt has its own id, so every sample is
    unambiguous), kept between ``floor_s`` and ``ceiling_s``, the ceiling until the
    first sample; doubled (up to the ceiling) by each attempt that timed out, until the
    next acknowledgement. Without the back-off a busy receiver is a positive feedback:
    its late acknowledgements send copies, which make it busier. With it a lost attempt
    costs about a slot, as in the model, where a fixed grace costs several.
    """

    def __init__(self, *, floor_s: float, ceiling_s: float) -> None:
        self.floor_s = floor_s
        self.ceiling_s = max(floor_s, ceiling_s)
        self.srtt: float | None = None
        self.rttvar = 0.0
        self.timeout_s = self.ceiling_s

    def sample(self, rtt_s: float) -> None:
        """An acknowledgement came ``rtt_s`` after its attempt was sent."""
        if self.srtt is None:
            self.srtt, self.rttvar = rtt_s, rtt_s / 2
        else:
            self.rttvar = 0.75 * self.rttvar + 0.25 * abs(self.srtt - rtt_s)
            self.srtt = 0.875 * self.srtt + 0.125 * rtt_s
        self.timeout_s = min(self.ceiling_s, max(self.floor_s, self.srtt + 4 * self.rttvar))

    def expired(self) -> None:
        """An attempt was not acknowledged in time."""
        self.timeout_s = min(self.ceiling_s, 2 * self.timeout_s)


#: the shortest acknowledgement timeout (scheduling jitter of a loaded small device)
ACK_FLOOR_S = 0.010


@dataclass
class _Flow:
    next: int = 0
    held: dict[int, dict[str, Any]] = field(default_factory=dict)
    draining: bool = False


@dataclass
class _Unconfirmed:
    """The packets of one flow originated here that its destination has not confirmed."""

    due: float  #: loop time its oldest packets are sent again, unless it progresses
    packets: dict[int, dict[str, Any]] = field(default_factory=dict)  #: by sequence
    wait: float = RESEND_AFTER_S


FlowKey = tuple[str, str, str]  #: (app, flow, destination)


class Confirmations:
    """The packets originated here that their destinations have not confirmed, per
    flow, and which of them to send again when (sans-IO: the caller passes the loop
    time and the ids of the packets still carried from here)."""

    def __init__(self) -> None:
        self._flows: dict[FlowKey, _Unconfirmed] = {}

    def add(self, key: FlowKey, seq: int, packet: dict[str, Any], now: float) -> None:
        out = self._flows.get(key)
        if out is None:
            out = self._flows[key] = _Unconfirmed(now + RESEND_AFTER_S)
        out.packets[seq] = packet

    def confirm(self, key: FlowKey, upto: int, now: float) -> int:
        """The destination has everything up to ``upto``: how many packets that confirms."""
        out = self._flows.get(key)
        if out is None:
            return 0
        confirmed = [q for q in out.packets if q <= upto]
        if not confirmed:
            return 0
        for seq in confirmed:
            del out.packets[seq]
        if not out.packets:
            del self._flows[key]
        else:
            out.wait = RESEND_AFTER_S  # progress: the flow's clock starts again
            out.due = now + out.wait
        return len(confirmed)

    def due(self, now: float, holding: Collection[str]) -> list[dict[str, Any]]:
        """The oldest packets of the flows that made no progress in time, to send again
        (none of a flow whose oldest packet is still carried from here); each such
        flow waits twice as long for the next try, up to ``RESEND_MAX_S``."""
        resend: list[dict[str, Any]] = []
        for out in self._flows.values():
            if out.due > now:
                continue
            oldest = list(itertools.islice(out.packets.values(), RESEND_BURST))
            if oldest and oldest[0]["i"] in holding:  # still carried from here
                out.due = now + out.wait
                continue
            out.wait = min(RESEND_MAX_S, 2 * out.wait)
            out.due = now + out.wait
            resend.extend(p for p in oldest if p["i"] not in holding)
        return resend

    def forget(self, app: str) -> int:
        """Drop an app's flows: how many packets were still unconfirmed."""
        keys = [k for k in self._flows if k[0] == app]
        return sum(len(self._flows.pop(k).packets) for k in keys)


class LinkLearning:
    """What one peer learnt about its links (sans-IO): a KL-UCB planner per destination
    (:class:`~agiledart.bandit.relay.HopPlanner`, seeded with the model's hop counts as
    costs to go) and an acknowledgement timer per neighbour."""

    def __init__(
        self, *, name: str, model: LinkModel, exploration: float, ack_grace_s: float
    ) -> None:
        self.name, self.model = name, model
        self.exploration, self.ack_grace_s = exploration, ack_grace_s
        self.planners: dict[str, HopPlanner] = {}
        self.timers: dict[str, AckTimer] = {}

    def planner(self, dest: str) -> HopPlanner:
        planner = self.planners.get(dest)
        if planner is None:
            hops = self.model.hops_to(dest)
            planner = HopPlanner(exploration=self.exploration)
            for w in self.model.neighbours(self.name):
                planner.add_neighbour(w, cost_to_go=float(hops.get(w, math.inf)))
            self.planners[dest] = planner
        return planner

    def cost_to_go(self, dest: str, sender: str, tau: int) -> float:
        """This peer's learnt cost to ``dest`` for a packet from ``sender`` (never back)."""
        return self.planner(dest).cost_to_go(max(1, tau), exclude=(sender,))

    def timer(self, w: str) -> AckTimer:
        timer = self.timers.get(w)
        if timer is None:
            timer = self.timers[w] = AckTimer(floor_s=ACK_FLOOR_S, ceiling_s=self.ack_grace_s)
        return timer

    def ack_timeout_ms(self) -> float:
        """The mean acknowledgement timeout over the neighbours tried (the ceiling
        before any): what a lost attempt costs beyond its slot, for ``optimal_ms``."""
        timers = list(self.timers.values())
        if not timers:
            return self.ack_grace_s * 1000.0
        return 1000.0 * sum(t.timeout_s for t in timers) / len(timers)


class Relay:
    def __init__(
        self,
        *,
        name: str,
        model: LinkModel,
        links: Links,
        address: Callable[[], Address],
        resolve: Resolve,
        deliver: Deliver,
        trace: Tracer,
        exploration: float = DEFAULT_EXPLORATION,
        ack_grace_ms: float = 100.0,
        seed: int | None = None,
    ) -> None:
        self.name = name
        self.model = model
        self.links = links
        self.trace = trace
        self.exploration = exploration
        self.ack_grace_s = ack_grace_ms / 1000.0
        self.stats = RelayStatistics()
        self._resolve = resolve
        self._own_address = address
        self._deliver = deliver
        self._rng = random.Random(seed if seed is not None else secrets.randbits(64))
        self._incarnation = secrets.token_hex(4)
        self._learnt = LinkLearning(
            name=name, model=model, exploration=exploration, ack_grace_s=self.ack_grace_s
        )
        self._k: dict[str, int] = {}  #: packets originated per destination
        self._flow_seq: dict[tuple[str, str, str], int] = {}
        self._flows: dict[tuple[str, str, str], _Flow] = {}
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._acks: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._attempt_ids = itertools.count(1)
        self._addresses: dict[str, Address] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self._bug_logged = False
        self._holding: set[str] = set()  #: ids of the packets in this peer's custody
        #: packets originated here, per (app, flow, destination)
        self._unconfirmed = Confirmations()
        self._resender: asyncio.Task[None] | None = None

    def carries(self, dest: str) -> bool:
        """Whether data from here to ``dest`` travels over the emulated network."""
        return self.model.covers(self.name) and self.model.covers(dest) and dest != self.name

    # -- the origin -----------------------------------------------------------------------

    async def submit(
        self, app: str, flow: str, kind: str, body: dict[str, Any], dest: str, address: Address
    ) -> None:
        """Take custody of one batch (``kind`` "data"), watermark ("wm") or barrier
        ("bar") for ``dest``, until ``dest`` confirms it."""
        # one flow per generation: a packet sent again after a recovery must not take
        # the place of the new generation's packet with the same sequence number
        flow = f"{flow}~g{body.get('g', 0)}"
        seq = self._flow_seq.get((app, flow, dest), 0)  # an edge's own order, per dest
        self._flow_seq[(app, flow, dest)] = seq + 1
        k = self._k.get(dest, 0) + 1
        self._k[dest] = k
        self._addresses[dest] = address
        # unique per origin: k counts per destination, so the id names it too (a relay
        # that was once a destination must not take this for a copy)
        pid = f"{self.name}~{self._incarnation}~{dest}~{k}"
        packet = {
            "i": pid,
            "a": app,
            "f": flow,
            "q": seq,
            "o": self.name,
            "oa": list(self._own_address()),
            "d": dest,
            "da": list(address),
            "k": kind,
            "b": body,
            "p": [self.name],
            "tau": k,
            "t0": time.time() * 1000.0,
            "n": 0,
        }
        self.stats.sent += 1
        self._remember(pid)
        self._holding.add(pid)
        now = asyncio.get_running_loop().time()
        self._unconfirmed.add((app, flow, dest), seq, packet, now)
        self.stats.unconfirmed += 1
        if self._resender is None and not self._closed:
            self._resender = asyncio.ensure_future(self._resend_loop())
        self._spawn(self._forward(packet))

    async def _resend_loop(self) -> None:
        """Send again the oldest packets of a flow that made no progress in time: a
        relay that died (or restarted) holding one took it with it."""
        loop = asyncio.get_running_loop()
        while not self._closed:
            await asyncio.sleep(RESEND_CHECK_S)
            for packet in self._unconfirmed.due(loop.time(), self._holding):
                self.stats.resent += 1
                self._holding.add(packet["i"])
                self._spawn(self._forward({**packet, "p": [self.name]}))

    async def on_done(self, msg: dict[str, Any], conn: ConnectionInfo) -> None:
        """A destination confirms a flow's packets up to sequence ``q``."""
        app, flow, dest, upto = msg.get("a"), msg.get("f"), msg.get("d"), msg.get("q")
        if not (isinstance(app, str) and isinstance(flow, str) and isinstance(dest, str)):
            err = "relay_done needs 'a', 'f' and 'd' strings"
            raise MalformedError(err)
        if type(upto) is not int:
            err = "relay_done needs an integer 'q'"
            raise MalformedError(err)
        if conn.peer_name != dest:  # only the destination confirms
            return
        now = asyncio.get_running_loop().time()
        self.stats.unconfirmed -= self._unconfirmed.confirm((app, flow, dest), upto, now)

    async def _confirm(self, packet: dict[str, Any], upto: int) -> None:
        """Tell a flow's origin that everything up to ``upto`` arrived here."""
        body = {"a": packet["a"], "f": packet["f"], "d": self.name, "q": upto}
        with contextlib.suppress(OverlayError):
            client = await self.links.client(_address(packet["oa"]))
            await client.send("relay_done", body)

    # -- every hop ------------------------------------------------------------------------

    async def _forward(self, packet: dict[str, Any]) -> None:
        """Carry a packet this peer has custody of until a next hop takes it."""
        try:
            await self._carry(packet)
        finally:
            self._holding.discard(packet["i"])

    async def _carry(self, packet: dict[str, Any]) -> None:
        dest: str = packet["d"]
        planner = self._learnt.planner(dest)
        refused: set[str] = set()
        while not self._closed:
            tau = int(packet["tau"])
            on_path = set(packet["p"])
            try:
                w = str(planner.choose(tau, on_path | refused))
            except NoRouteError:
                try:  # every loop-free choice is used up: allow a revisit
                    w = str(planner.choose(tau, {self.name} | refused))
                except NoRouteError:
                    refused.clear()
                    await asyncio.sleep(NO_ROUTE_WAIT_S)
                    continue
            omega = planner.link_cost(w, tau)
            j = next(s.cost_to_go for s in planner.links() if s.neighbour == w)
            packet["n"] = int(packet["n"]) + 1  # attempts so far, this one included
            try:
                outcome, ack, delay_ms = await self._attempt(w, packet)
            except Exception:  # a bug must not lose the packet: log, count, try again
                if not self._bug_logged:
                    self._bug_logged = True
                    log.exception("relay attempt to %s failed unexpectedly", w)
                self.stats.failures += 1
                await asyncio.sleep(self.model.slot_ms / 1000.0 + self._learnt.timer(w).timeout_s)
                outcome, ack, delay_ms = "lost", None, 0.0
            self.trace.emit(
                "shuffle",
                app=packet["a"],
                packet=packet["i"],
                origin=packet["o"],
                dest=dest,
                hop=len(packet["p"]) - 1,
                node=self.name,
                next=w,
                outcome=outcome,
                delay_ms=round(delay_ms, 3),
                policy=POLICY,
                graph=self.model.name,
                tau=tau,
                omega=omega,
                j=None if math.isinf(j) else j,
            )
            if outcome == "refused":
                refused.add(w)
                continue
            planner.record(w, outcome == "ok")
            if ack is not None:
                advertised = ack.get("j")
                with contextlib.suppress(AgiledartError):
                    planner.advertise(w, math.inf if advertised is None else float(advertised))
            if outcome == "ok":
                return

    async def _attempt(
        self, w: str, packet: dict[str, Any]
    ) -> tuple[str, dict[str, Any] | None, float]:
        loop = asyncio.get_running_loop()
        started = loop.time()
        timer = self._learnt.timer(w)
        deadline = started + self.model.slot_ms / 1000.0 + timer.timeout_s
        self.stats.attempts += 1
        attempt = next(self._attempt_ids)
        future: asyncio.Future[dict[str, Any]] = loop.create_future()
        self._acks[attempt] = future
        try:
            address = await self._address_of(w)
            if address is not None:
                client = await self.links.client(address)
                await client.send("relay", {**packet, "x": attempt})
            async with asyncio.timeout_at(deadline):
                ack = await future
            timer.sample(loop.time() - started)
        except (TimeoutError, OverlayError):
            self.stats.failures += 1
            timer.expired()
            await asyncio.sleep(max(0.0, deadline - loop.time()))
            return "lost", None, (loop.time() - started) * 1000.0
        finally:
            self._acks.pop(attempt, None)
        if not ack.get("ok"):
            self.stats.refused += 1
            return "refused", ack, (loop.time() - started) * 1000.0
        # an attempt lasts one slot, success or not
        await asyncio.sleep(max(0.0, started + self.model.slot_ms / 1000.0 - loop.time()))
        return "ok", ack, (loop.time() - started) * 1000.0

    async def _address_of(self, peer: str) -> Address | None:
        address = self._addresses.get(peer)
        if address is None:
            address = await self._resolve(peer)
            if address is not None:
                self._addresses[peer] = address
        return address

    # -- receiving ------------------------------------------------------------------------

    async def on_relay(self, msg: dict[str, Any], conn: ConnectionInfo) -> None:
        """A packet attempt from ``conn``'s peer (a stream handler: never blocks)."""
        packet = _checked(msg)
        sender = conn.peer_name
        theta = self.model.theta(sender, self.name)
        if theta is not None and self._rng.random() >= theta:
            self.stats.lost_here += 1
            return
        attempt = packet.pop("x")
        dest = packet["d"]
        pid = packet["i"]
        if pid in self._seen:
            self.stats.duplicates += 1
            if dest == self.name:  # delivered, or held back for its turn: safe to drop
                await self._ack(conn, attempt, True, 0.0)
                return
            if pid in self._holding:  # two copies met: the smaller name keeps its own
                keep = self.name < sender
                await self._ack(
                    conn, attempt, keep, self._learnt.cost_to_go(dest, sender, int(packet["tau"]))
                )
                return
            # passed on before: its copy is taken like a new packet
        if dest != self.name:
            j = self._learnt.cost_to_go(dest, sender, int(packet["tau"]))
            if math.isinf(j):
                await self._ack(conn, attempt, False, j)
                return
        else:
            j = 0.0
        self._remember(pid)
        if dest != self.name:
            self._holding.add(pid)
        packet["p"] = [*packet["p"], self.name]
        await self._ack(conn, attempt, True, j)
        self._addresses.setdefault(packet["o"], _address(packet["oa"]))
        if dest == self.name:
            self._spawn(self._arrive(packet))
        else:
            self.stats.forwarded += 1
            self._spawn(self._relay_after_slot(packet))

    async def on_ack(self, msg: dict[str, Any], conn: ConnectionInfo) -> None:
        attempt = msg.get("x")
        if type(attempt) is not int:
            err = "relay_ack needs an integer 'x'"
            raise MalformedError(err)
        future = self._acks.get(attempt)
        if future is None or future.done():
            self.stats.late_acks += 1
            return
        future.set_result(msg)

    async def _ack(self, conn: ConnectionInfo, attempt: int, ok: bool, j: float) -> None:
        body = {"x": attempt, "ok": ok, "j": None if math.isinf(j) else j}
        with contextlib.suppress(OverlayError):
            await conn.send("relay_ack", body)

    def _remember(self, pid: str) -> None:
        self._seen[pid] = None
        if len(self._seen) > SEEN_MAX:
            self._seen.popitem(last=False)

    async def _relay_after_slot(self, packet: dict[str, Any]) -> None:
        await asyncio.sleep(self.model.slot_ms / 1000.0)
        await self._forward(packet)

    async def _arrive(self, packet: dict[str, Any]) -> None:
        await asyncio.sleep(self.model.slot_ms / 1000.0)
        key = (packet["a"], packet["o"], packet["f"])
        flow = self._flows.setdefault(key, _Flow())
        seq = int(packet["q"])
        if seq < flow.next or seq in flow.held:
            self.stats.duplicates += 1
            if seq < flow.next:  # sent again: its origin missed the confirmation
                await self._confirm(packet, flow.next - 1)
            return
        flow.held[seq] = packet
        self.trace.emit(
            "delivery",
            app=packet["a"],
            packet=packet["i"],
            origin=packet["o"],
            dest=self.name,
            k=int(packet["tau"]),
            path=list(packet["p"]),
            attempts=int(packet["n"]),
            delay_ms=round(time.time() * 1000.0 - float(packet["t0"]), 3),
            optimal_ms=self.model.optimal_ms(packet["o"], self.name, self._learnt.ack_timeout_ms()),
            policy=POLICY,
            graph=self.model.name,
        )
        if flow.draining:
            return
        flow.draining = True
        try:
            while flow.next in flow.held:
                ready = flow.held.pop(flow.next)
                flow.next += 1
                self.stats.delivered += 1
                try:
                    await self._deliver(ready["k"], ready["b"], ready["o"], _address(ready["oa"]))
                except AgiledartError as exc:
                    log.warning("relayed %s from %s not delivered: %s", ready["k"], ready["o"], exc)
        finally:
            flow.draining = False
        await self._confirm(packet, flow.next - 1)

    # -- housekeeping ---------------------------------------------------------------------

    def forget(self, app: str) -> None:
        """An app left this peer: drop its flows' order state."""
        for flow in [k for k in self._flows if k[0] == app]:
            del self._flows[flow]
        for seq in [k for k in self._flow_seq if k[0] == app]:
            del self._flow_seq[seq]
        self.stats.unconfirmed -= self._unconfirmed.forget(app)

    def _spawn(self, coro: Awaitable[None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("relay task failed", exc_info=task.exception())

    async def aclose(self) -> None:
        self._closed = True
        tasks = list(self._tasks)
        if self._resender is not None:
            tasks.append(self._resender)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task

    def info(self) -> dict[str, Any]:
        """What ``ring --json`` shows: counters and what this peer learnt per link."""
        return {
            "links": self.model.name,
            "neighbours": list(self.model.neighbours(self.name)),
            "stats": dict(self.stats.__dict__),
            "in_flight": len(self._tasks),
            "planners": {
                dest: [
                    {
                        "to": s.neighbour,
                        "attempts": s.attempts,
                        "successes": s.successes,
                        "j": None if math.isinf(s.cost_to_go) else s.cost_to_go,
                    }
                    for s in planner.links()
                ]
                for dest, planner in self._learnt.planners.items()
            },
        }


_FIELDS: dict[str, type | tuple[type, ...]] = {
    "i": str,
    "a": str,
    "f": str,
    "q": int,
    "o": str,
    "oa": list,
    "d": str,
    "da": list,
    "k": str,
    "b": dict,
    "p": list,
    "tau": int,
    "t0": (int, float),
    "n": int,
    "x": int,
}


def _checked(msg: dict[str, Any]) -> dict[str, Any]:
    for name, kind in _FIELDS.items():
        value = msg.get(name)
        if not isinstance(value, kind) or isinstance(value, bool):
            err = f"relay frame needs {name!r} of type {kind}"
            raise MalformedError(err)
    if msg["k"] not in ("data", "wm", "bar") or not all(isinstance(p, str) for p in msg["p"]):
        err = "relay frame has a bad kind or path"
        raise MalformedError(err)
    _address(msg["oa"])
    _address(msg["da"])
    return {name: msg[name] for name in _FIELDS}  # not the frame's envelope keys


def _address(raw: Any) -> Address:
    if (
        not isinstance(raw, list | tuple)
        or len(raw) != 2
        or not isinstance(raw[0], str)
        or type(raw[1]) is not int
    ):
        err = f"bad address {raw!r} in a relay frame"
        raise MalformedError(err)
    return raw[0], raw[1]
