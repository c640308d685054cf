"""The peer-side driver of the scaling controllers (agiledart.runtime.scaling): live
counters in, measurements and actions out; a fake instance and a manual clock."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest

from agiledart.app import parse_spec
from agiledart.app.spec import ScalingSpec
from agiledart.runtime.scaling import ElasticDriver, Sample, rates


@dataclass
class Stats:
    wait_s: float = 0.0


@dataclass
class Edge:
    stats: Stats = field(default_factory=Stats)


@dataclass
class Seg:
    ops: list[str]
    replicas: int = 1
    scalable: bool = True
    arrived: int = 0
    executed: int = 0
    service_s: float = 0.0
    pending: int = 0


@dataclass
class Config:
    workers: int = 4


@dataclass
class Engine:
    chains: bool = False
    config: Config = field(default_factory=Config)


class Inst:
    def __init__(self, op: str, stateful: bool) -> None:
        kind = {"op": "aggregate", "params": {"key": "key", "aggregate": "count"}}
        stateless = {"op": "map", "fn": "builtin:identity"}
        self.spec = parse_spec(
            {
                "name": "d",
                "sources": [
                    {
                        "id": "src",
                        "peer": "p",
                        "connector": "generator",
                        "params": {"dataset": "counter", "rate": 10, "count": 10},
                    }
                ],
                "operators": [{"id": op, **(kind if stateful else stateless), "inputs": ["src"]}],
                "sinks": [{"id": "out", "peer": "p", "connector": "discard", "inputs": [op]}],
            }
        )
        self.app_id, self.me = "d-1", "p"
        self.engine = Engine()
        self.segments = [Seg([op])]
        self.edges = {op: [Edge()]}
        self.resized: list[int] = []
        self.spawned: list[Any] = []

    def resize(self, seg: Seg, n: int) -> None:
        self.resized.append(n)
        seg.replicas = n

    def spawn(self, coro: Any) -> None:
        self.spawned.append(coro)


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def advance(
    inst: Inst, clock: Clock, *, arrived: int, executed: int, service: float, wait: float = 0.0
) -> None:
    """One second of the segment's life."""
    seg = inst.segments[0]
    clock.t += 1.0
    seg.arrived += arrived
    seg.executed += executed
    seg.service_s += service
    inst.edges[seg.ops[0]][0].stats.wait_s += wait


def driver(inst: Inst, clock: Clock, **spec: Any) -> tuple[ElasticDriver, list[dict[str, Any]]]:
    asked: list[dict[str, Any]] = []

    async def request(body: dict[str, Any]) -> None:
        asked.append(body)

    settings = ScalingSpec(enabled=spec.pop("enabled", True), cooldown_ms=0, **spec)
    d = ElasticDriver(inst, settings, request=request, clock=clock)  # type: ignore[arg-type]
    return d, asked


def test_a_compute_bottleneck_scales_up_on_the_peer() -> None:
    inst, clock = Inst("slow", stateful=False), Clock()
    d, asked = driver(inst, clock)
    assert asyncio.run(d.tick()) == []  # the first sample: nothing to compare with
    inst.segments[0].pending = 2_000
    advance(inst, clock, arrived=1_000, executed=500, service=1.0)
    (decision,) = asyncio.run(d.tick())
    assert decision.action.value == "up"
    assert decision.health < 0.85
    assert inst.resized == [decision.target]
    assert 2 <= decision.target <= 4  # at most the workers
    assert not asked
    view = d.view()["slow"]
    assert view["instances"] == decision.target
    assert view["changes"][0]["action"] == "up"
    assert view["last"]["bottleneck"] == "compute"


def test_a_saturated_link_migrates_a_stateful_operator_through_the_scheduler() -> None:
    inst, clock = Inst("counts", stateful=True), Clock()
    d, asked = driver(inst, clock)
    asyncio.run(d.tick())
    inst.segments[0].pending = 4_000
    advance(inst, clock, arrived=300, executed=300, service=0.01, wait=0.9)
    (decision,) = asyncio.run(d.tick())
    assert decision.action.value == "migrate"
    assert decision.bottleneck is not None
    assert decision.bottleneck.value == "bandwidth"
    assert inst.resized == []
    (coro,) = inst.spawned

    async def ask() -> None:
        await coro

    asyncio.run(ask())
    (body,) = asked
    assert body["action"] == "migrate"
    assert body["operators"] == ["counts"]
    assert body["peer"] == "p"


def test_disabled_scaling_reports_decisions_but_changes_nothing() -> None:
    inst, clock = Inst("slow", stateful=False), Clock()
    d, _ = driver(inst, clock, enabled=False)
    asyncio.run(d.tick())
    inst.segments[0].pending = 2_000
    advance(inst, clock, arrived=1_000, executed=500, service=1.0)
    (decision,) = asyncio.run(d.tick())
    assert decision.action.value == "up"
    assert inst.resized == []
    assert d.view()["slow"]["last"]["enabled"] is False


def test_no_workers_means_one_instance_at_most() -> None:
    inst, clock = Inst("slow", stateful=False), Clock()
    inst.engine.chains = True  # the inline engine: operators run in the peer's loop
    d, _ = driver(inst, clock)
    assert d.capacity(inst.segments[0]) == 1  # type: ignore[arg-type]
    asyncio.run(d.tick())
    inst.segments[0].pending = 2_000
    advance(inst, clock, arrived=1_000, executed=500, service=1.0)
    (decision,) = asyncio.run(d.tick())
    assert decision.action.value == "hold"
    assert "max_instances" in decision.reason


def test_the_service_rate_counts_the_time_spent_waiting_for_the_links() -> None:
    old, new = Sample(0.0, 0, 0, 0.0, 0.0), Sample(2.0, 1_000, 800, 0.4, 1.0)
    m = rates(old, new, instances=2, queue=10, mu=None)
    assert m.rate == pytest.approx(500.0)
    assert m.service_rate == pytest.approx(800 / (0.4 + 2 * 1.0))
    assert m.busy == pytest.approx(0.4 / 4)
    assert m.link_wait == pytest.approx(0.5)
    idle = rates(old, Sample(1.0, 0, 0, 0.0, 0.0), instances=1, queue=0, mu=123.0)
    assert idle.service_rate == 123.0  # nothing executed: the last rate known stands
    stuck = rates(old, Sample(1.0, 10, 0, 0.0, 0.9), instances=1, queue=5, mu=123.0)
    assert stuck.service_rate == 0.0  # blocked on its links the whole time


def test_an_app_that_does_not_scale_is_scored_less_often_unless_traced() -> None:
    from agiledart.runtime.scaling import IDLE_INTERVAL_S
    from agiledart.traces import NullTraceWriter

    class Traced:
        enabled = True

        def emit(self, type: str, **fields: Any) -> None:
            pass

    inst = Inst("slow", stateful=False)
    on = ScalingSpec(enabled=True, interval_ms=1_000)
    off = ScalingSpec(enabled=False, interval_ms=1_000)
    slow = ScalingSpec(enabled=False, interval_ms=30_000)

    def cadence(spec: ScalingSpec, trace: Any) -> float:
        return ElasticDriver(inst, spec, trace=trace).cadence()  # type: ignore[arg-type]

    assert cadence(on, None) == 1.0  # it acts: every interval
    assert cadence(on, NullTraceWriter()) == 1.0
    assert cadence(off, Traced()) == 1.0  # every decision goes to the trace
    assert cadence(off, None) == IDLE_INTERVAL_S  # only reported: less often
    assert cadence(off, NullTraceWriter()) == IDLE_INTERVAL_S
    assert cadence(slow, None) == 30.0  # never more often than asked
