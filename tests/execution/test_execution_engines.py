"""The engines in process: a unit measured in the peer moves to the workers with its
state and goes on where it left off; a cheap unit stays; a worker's failure is typed."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from agiledart import apps
from agiledart.app.parse import parse_spec
from agiledart.datasets import generate_batches
from agiledart.local.executor import Executor
from agiledart.runtime.execution import EngineConfig
from agiledart.runtime.execution.engines import PROBE_RECORDS, Unit, make_engine
from agiledart.runtime.execution.host import TurnFailed, WorkerProcess

OPS = ["sampled", "halved", "per-key"]  # filter -> map -> keyed running sum (stateful)


class Queue:
    pending = 1

    def oldest_s(self, now: float) -> float | None:
        return None

    def rate(self, now: float) -> float:
        return 0.0


def batches(n: int) -> list[list[dict[str, Any]]]:
    spec = apps.load("throughput").sources[0].params
    kwargs = {k: spec[k] for k in ("rate", "seed", "keys")}
    return list(generate_batches("counter", count=n, batch_size=250, **kwargs))


async def run_unit(config: EngineConfig, tmp_path: Path) -> tuple[list[Any], Unit, Any]:
    spec = apps.load("throughput")
    engine = make_engine(config, tmp_path)
    unit = engine.unit(app_id="a1", uid=0, executor=Executor(spec, operators=OPS), queue=Queue())
    out: list[Any] = []
    async with asyncio.TaskGroup() as group:
        engine.start(group)
        await engine.open_app("a1", spec, [unit], [])
        for batch in batches(3 * PROBE_RECORDS):
            out += await unit.feed("readings", batch)
        out += await unit.watermark("readings", 2**62)
        info = engine.info()
        await engine.close_app("a1")
        await engine.aclose()
    return out, unit, info


async def test_an_expensive_unit_moves_to_the_workers_with_its_state(tmp_path: Path) -> None:
    expected = Executor(apps.load("throughput"), operators=OPS)
    want: list[Any] = []
    for batch in batches(3 * PROBE_RECORDS):
        want += expected.feed("readings", batch)
    want += expected.watermark("readings", 2**62)
    # a limit every operator exceeds: the unit moves after its first PROBE_RECORDS
    got, unit, info = await run_unit(EngineConfig(workers=2, offload_us=1e-6), tmp_path)
    assert not unit.local
    assert sum(info["turns"]) > 2  # turns ran in the workers, beyond the app definitions
    assert got == want  # the running sums went on from the handed-over state
    assert unit.executor.operators["per-key"].stats.records_in == sum(
        1 for b in batches(3 * PROBE_RECORDS) for r in b if r["seq"] % 10
    )


async def test_a_cheap_unit_stays_in_the_peer(tmp_path: Path) -> None:
    _, unit, info = await run_unit(EngineConfig(workers=1, offload_us=1e6), tmp_path)
    assert unit.local
    assert info["in_peer"] == ["a1/sampled+halved+per-key"]


async def test_a_bad_request_fails_the_turn_not_the_worker() -> None:
    async with asyncio.TaskGroup() as group:
        proc = WorkerProcess("t")
        await proc.start(group)
        with pytest.raises(TurnFailed, match="KeyError"):
            await proc.call(("feed", "no-such-app", 0, "x", [], None))
        assert (await proc.call(("ping",)))[0] == proc.pid
        await proc.close()


async def test_the_records_an_error_drops_in_a_worker_come_back_to_the_peer(
    tmp_path: Path,
) -> None:
    """``on_error: dead_letter``: what an operator run by a worker dropped reaches the
    peer with the turn's counters, each record as it came, for the dead-letter sink."""
    spec = parse_spec(
        {
            "name": "letters",
            "sources": [
                {
                    "id": "readings",
                    "peer": "p",
                    "connector": "generator",
                    "params": {"dataset": "counter", "rate": 1000, "count": 1},
                }
            ],
            "operators": [
                {
                    "id": "sampled",
                    "op": "filter",
                    "fn": "builtin:skip_every",
                    "params": {"field": "seq", "n": 10},
                    "inputs": ["readings"],
                    "on_error": "dead_letter",
                    "dead_letter": {"type": "file"},
                }
            ],
            "sinks": [{"id": "out", "peer": "p", "connector": "discard", "inputs": ["sampled"]}],
        }
    )
    fed = [
        [{**r, "seq": f"bad-{r['seq']}"} if r["seq"] % 3 == 0 else r for r in batch]
        for batch in batches(3 * PROBE_RECORDS)
    ]
    engine = make_engine(EngineConfig(workers=1, offload_us=1e-6), tmp_path)
    unit = engine.unit(app_id="a1", uid=0, executor=Executor(spec), queue=Queue())
    stats = unit.executor.operators["sampled"].stats
    failed: list[dict[str, Any]] = []
    async with asyncio.TaskGroup() as group:
        engine.start(group)
        await engine.open_app("a1", spec, [unit], [])
        for batch in fed:
            await unit.feed("readings", batch)
            failed += stats.failed  # as the app instance takes them after every turn
            stats.failed = []
        moved = not unit.local
        await engine.close_app("a1")
        await engine.aclose()
    assert moved  # most turns ran in the worker
    assert [f["record"] for f in failed] == [r for b in fed for r in b if isinstance(r["seq"], str)]
    assert {f["type"] for f in failed} == {"TypeError"}
    assert stats.errors == len(failed)
