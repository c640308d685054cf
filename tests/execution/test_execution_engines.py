"""The engines in process: a unit measured in the peer moves to the workers with its
state and goes on where it left off; a cheap unit stays; a worker's failure is typed."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from agiledart import apps
from agiledart.app.local import Executor
from agiledart.datasets import generate_batches
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
