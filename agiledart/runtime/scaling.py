"""The scaling controllers of one app instance on one peer (paper §IV-C; docs/scaling.md).

Every peer runs, for every operator group (segment) it hosts, one
:class:`~agiledart.scaling.ScalingController`, and drives it from the live counters of
that segment every ``scaling.interval_ms``: there is no master, and a decision is
taken where the operator runs. Theory of operation, per tick:

1. Measure over about the last two seconds (:meth:`ElasticDriver.measure`): λ, the records put
   in the inbox per second (offered, not processed); q, the records waiting now; the
   share of time the replicas executed (``busy``) and the share the segment waited for
   its output links (credit, or the emulated uplink: ``link_wait``). The service rate
   of one instance counts both: μ = records / (execution time + x · link wait), so an
   instance that cannot get its output out is as slow as its links let it be, and the
   health score falls whichever resource is short; ``link_wait`` and ``busy`` then
   tell the controller which one it is.
2. ``observe`` decides (hold, up, down, scale-out, migrate) with the secant rule, its
   first step up along the line through the origin (no instances, no capacity), and a
   backlog expected to drain within ``scaling.latency_ms`` (the health model's L); a
   step down only after three observations in a row over the dead-band.
3. Act, when ``scaling.enabled``: up and down change the number of replicas of the
   operator on this peer's workers (:meth:`AppInstance.resize`: between two inbox items,
   keyed state re-split exactly; see :mod:`agiledart.runtime.replicas`); scale-out and
   migrate need other peers, so they go to the app's scheduler (``app_scale``), which
   cuts a checkpoint and redeploys the app from it with the operator on a leaf-set
   peer (stateless: added; stateful: moved, with its state): no record lost or counted
   twice, as after a recovery.

Every decision is kept for ``status`` (the last one per operator, the changes and the
last 90 decisions' health in short histories) and written as a ``scaling`` trace
record.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from agiledart.app.spec import ScalingSpec
from agiledart.scaling import (
    Action,
    HealthModel,
    Measurement,
    ScalingController,
    ScalingDecision,
    ScalingPolicy,
    SecantRule,
)

if TYPE_CHECKING:
    from agiledart.runtime.instance import AppInstance
    from agiledart.runtime.segments import Segment

log = logging.getLogger(__name__)

__all__ = ["ElasticDriver", "Sample"]

#: changes kept per operator for ``status``
HISTORY = 32
#: decisions (time, instances, health, action) kept per operator: a health timeline
RECENT = 90
#: seconds between two scorings of an app that does not scale, when no trace directory
#: records every decision: what its controllers would do is still reported, for a
#: tenth of the cost (BENCHMARKS.md, "Many small queries")
IDLE_INTERVAL_S = 10.0


class Tracer(Protocol):
    def emit(self, type: str, **fields: Any) -> None: ...


@dataclass(frozen=True, slots=True)
class Sample:
    """A segment's cumulative counters at one time."""

    at: float
    arrived: int
    executed: int
    service_s: float
    wait_s: float


def rates(
    old: Sample, new: Sample, *, instances: int, queue: float, mu: float | None
) -> Measurement:
    """The :class:`Measurement` between two samples (see the module docstring);
    ``mu`` is the last service rate known, kept while nothing was executed."""
    dt = max(new.at - old.at, 1e-6)
    arrived = max(0, new.arrived - old.arrived)
    executed = max(0, new.executed - old.executed)
    service = max(0.0, new.service_s - old.service_s)
    wait = max(0.0, new.wait_s - old.wait_s)
    link_wait = min(1.0, wait / dt)
    occupied = service + instances * wait
    if executed and occupied > 0:
        mu = executed / occupied
    elif executed:
        mu = float("inf")
    elif link_wait > 0.5 and (arrived or queue):
        mu = 0.0  # stuck behind its links
    return Measurement(
        instances=instances,
        rate=arrived / dt,
        service_rate=mu,
        queue=float(queue),
        busy=min(1.0, service / (dt * instances)),
        link_wait=link_wait,
    )


class ElasticDriver:
    """The controllers of one app instance's segments, and what they decided."""

    def __init__(
        self,
        inst: AppInstance,
        spec: ScalingSpec,
        *,
        trace: Tracer | None = None,
        request: Callable[[dict[str, Any]], Awaitable[Any]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.inst = inst
        self.spec = spec
        self.trace = trace
        self.request = request
        self.clock = clock
        self.controllers: dict[str, ScalingController] = {}
        self._samples: dict[str, collections.deque[Sample]] = {}
        self._mu: dict[str, float | None] = {}
        self.last: dict[str, dict[str, Any]] = {}  #: operator -> its last decision
        self.history: dict[str, collections.deque[dict[str, Any]]] = {}
        self.recent: dict[str, collections.deque[list[Any]]] = {}
        self.counts: dict[str, collections.Counter[str]] = {}
        self.asked = False  #: a scale-out or migration went to the scheduler

    # -- configuration ----------------------------------------------------------------

    def capacity(self, seg: Segment) -> int:
        """The most replicas ``seg`` may have here: 1 unless it can be split and the
        engine has workers to run them on."""
        engine = self.inst.engine
        if not seg.scalable or engine.chains:
            return 1
        return max(1, min(self.spec.max_instances, engine.config.workers or 1))

    def controller(self, seg: Segment) -> ScalingController:
        name = "+".join(seg.ops)
        ctl = self.controllers.get(name)
        if ctl is None:
            rule = SecantRule(
                max_instances=self.capacity(seg),
                target=self.spec.target,
                tolerance=self.spec.tolerance,
                cooldown_s=self.spec.cooldown_ms / 1000.0,
            )
            stateful = any(self.inst.spec.operator(o).stateful for o in seg.ops)
            model = HealthModel(target_latency_s=self.spec.latency_ms / 1000.0)
            policy = ScalingPolicy(rule=rule, model=model, through_origin=True, down_after=3)
            ctl = ScalingController(self.inst.app_id, name, stateful=stateful, policy=policy)
            self.controllers[name] = ctl
        return ctl

    # -- the loop ---------------------------------------------------------------------

    def cadence(self) -> float:
        """Seconds between two ticks: ``interval_ms`` when the controllers act on their
        decisions or a trace records each one; otherwise (scaling off, no trace
        directory: nobody needs every decision) at least :data:`IDLE_INTERVAL_S`."""
        interval = self.spec.interval_ms / 1000.0
        traced = self.trace is not None and getattr(self.trace, "enabled", True)
        if self.spec.enabled or traced:
            return interval
        return max(interval, IDLE_INTERVAL_S)

    async def run(self) -> None:
        """Tick every :meth:`cadence` seconds until cancelled (the instance's group owns
        it)."""
        interval = self.cadence()
        while True:
            await asyncio.sleep(interval)
            await self.tick()

    def sample(self, seg: Segment, now: float) -> Sample:
        wait = sum(e.stats.wait_s for op in seg.ops for e in self.inst.edges.get(op, ()))
        return Sample(now, seg.arrived, seg.executed, seg.service_s, wait)

    def measure(self, seg: Segment, now: float) -> Measurement | None:
        """The measurement of ``seg`` over about the last two seconds (None: first sample)."""
        name = "+".join(seg.ops)
        window = self._samples.setdefault(name, collections.deque(maxlen=6))
        new = self.sample(seg, now)
        window.append(new)
        if len(window) < 2:
            return None
        # the newest sample at least two seconds old (or the oldest kept)
        span = max(2.0, self.cadence()) - 1e-3
        old = next((s for s in reversed(list(window)[:-1]) if now - s.at >= span), window[0])
        m = rates(
            old,
            new,
            instances=seg.replicas,
            queue=seg.pending,
            mu=self._mu.get(name),
        )
        if m.service_rate is not None and m.service_rate > 0:
            self._mu[name] = m.service_rate
        return m

    async def tick(self) -> list[ScalingDecision]:
        now = self.clock()
        decisions = []
        for seg in list(self.inst.segments):
            m = self.measure(seg, now)
            if m is None:
                continue
            ctl = self.controller(seg)
            decision = ctl.observe(now, m)
            self._record(decision, m)
            decisions.append(decision)
            if self.spec.enabled and decision.changes:
                self._act(seg, decision)
        return decisions

    def forget(self, seg: Segment) -> None:
        """Drop ``seg``'s samples (its replicas changed: old counters mean other things)."""
        self._samples.pop("+".join(seg.ops), None)

    # -- acting -----------------------------------------------------------------------

    def _act(self, seg: Segment, d: ScalingDecision) -> None:
        if d.action in (Action.UP, Action.DOWN):
            target = min(d.target, self.capacity(seg))
            if target != seg.replicas:
                self.inst.resize(seg, target)
                self.forget(seg)
            return
        if self.request is None or self.asked:
            return
        self.asked = True  # one at a time: the redeploy replaces this instance
        body = {
            "app_id": self.inst.app_id,
            "operators": list(seg.ops),
            "action": d.action.value,
            "peer": self.inst.me,
            "instances": d.target,
            "health": round(d.health, 4),
            "reason": d.reason,
        }
        self.inst.spawn(self._ask(body))

    async def _ask(self, body: dict[str, Any]) -> None:
        assert self.request is not None
        try:
            await self.request(body)
        finally:
            self.asked = False

    # -- reporting --------------------------------------------------------------------

    def _record(self, d: ScalingDecision, m: Measurement) -> None:
        entry = {
            "action": d.action.value,
            "instances": d.instances,
            "target": d.target,
            "health": round(d.health, 4),
            "bottleneck": None if d.bottleneck is None else d.bottleneck.value,
            "reason": d.reason,
            "rate": round(m.rate, 1),
            "service_rate": None if m.service_rate is None else round(min(m.service_rate, 1e12), 1),
            "queue": m.queue,
            "busy": round(m.busy, 4),
            "link_wait": round(m.link_wait, 4),
            "enabled": self.spec.enabled,
            "at": round(time.time(), 3),
        }
        self.last[d.operator] = entry
        self.counts.setdefault(d.operator, collections.Counter())[d.action.value] += 1
        recent = self.recent.setdefault(d.operator, collections.deque(maxlen=RECENT))
        recent.append([entry["at"], d.instances, entry["health"], d.action.value])
        if d.changes:
            hist = self.history.setdefault(d.operator, collections.deque(maxlen=HISTORY))
            hist.append({k: entry[k] for k in ("action", "instances", "target", "health", "at")})
            log.info(
                "app %s: %s on %s: %s %d -> %d (%s)",
                d.app,
                d.operator,
                self.inst.me,
                d.action.value,
                d.instances,
                d.target,
                d.reason,
            )
        if self.trace is not None:
            self.trace.emit("scaling", **d.trace_fields())

    def view(self) -> dict[str, Any]:
        """Per operator group here: instances, the last decision, counts, changes."""
        out: dict[str, Any] = {}
        for seg in self.inst.segments:
            name = "+".join(seg.ops)
            out[name] = {
                "instances": seg.replicas,
                "max_instances": self.capacity(seg),
                "last": self.last.get(name),
                "decisions": dict(self.counts.get(name, {})),
                "changes": list(self.history.get(name, ())),
                "recent": list(self.recent.get(name, ())),
            }
        return out
