"""Scaling up on a peer's workers, in process: a keyed running sum (stateful) that a
worker pool runs goes from one instance to three and back to two while the app is
open (units added and dropped, state taken from the workers, merged and re-split by
key), its replicas running at once; every output equals one instance's."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from agiledart import apps
from agiledart.datasets import generate_batches
from agiledart.local.executor import Emission, Executor
from agiledart.runtime.execution import EngineConfig
from agiledart.runtime.execution.engines import Engine, Unit, make_engine
from agiledart.runtime.replicas import combine, merge_snapshots, split_records, split_snapshot

OP = "per-key"  # aggregate sum of seq by key


class Queue:
    pending = 1

    def oldest_s(self, now: float) -> float | None:
        return None

    def rate(self, now: float) -> float:
        return 0.0


def batches() -> list[list[dict[str, Any]]]:
    return list(generate_batches("counter", count=6_000, batch_size=200, rate=1000, keys=17))


def canonical(out: list[Emission]) -> list[str]:
    return sorted(
        json.dumps(r, sort_keys=True) for _, rs in out if isinstance(rs, list) for r in rs
    )


async def resize(engine: Engine, units: list[Unit], n: int, uid: int) -> list[Unit]:
    spec = apps.load("throughput")
    merged = merge_snapshots([(await engine.snapshot(u))[OP] for u in units])
    new = []
    for i, part in enumerate(split_snapshot(merged, n)):
        ex = Executor(spec, operators=[OP], states={OP: part})
        unit = engine.unit(app_id="a1", uid=uid + i, executor=ex, queue=Queue())
        unit.follow(units[0], {OP: part})
        await engine.add_unit(unit)
        new.append(unit)
    for u in units:
        await engine.drop_unit(u)
    return new


async def test_a_keyed_stateful_operator_changes_its_replicas_on_the_workers(
    tmp_path: Path,
) -> None:
    spec = apps.load("throughput")
    one = Executor(spec, operators=[OP])
    want: list[Emission] = []
    for b in batches():
        want += one.feed("halved", b)
    engine = make_engine(EngineConfig(workers=2, offload_us=1e-6), tmp_path)
    first = engine.unit(app_id="a1", uid=0, executor=Executor(spec, operators=[OP]), queue=Queue())
    got: list[Emission] = []
    async with asyncio.TaskGroup() as group:
        engine.start(group)
        await engine.open_app("a1", spec, [first], [])
        units = [first]
        plan = {12: 3, 20: 2, 26: 1}  # batch index -> replicas (the first moved at 10)
        for i, b in enumerate(batches()):
            if i in plan:
                units = await resize(engine, units, plan[i], uid=10 * i)
            parts = split_records(b, len(units), "key")
            outs = await asyncio.gather(
                *(u.feed("halved", p) for u, p in zip(units, parts, strict=True) if p)
            )
            got += combine(outs)
        assert not units[0].local  # ran on the workers
        assert len(engine.units) == 1
        info = engine.info()
        await engine.close_app("a1")
        await engine.aclose()
    assert sum(info["turns"]) > len(batches())  # turns ran in the workers
    assert canonical(got) == canonical(want)
