"""An app instance in process (source, keyed windowed sum and running count, file sink
on one peer, operators in a worker pool) whose stateful operators are scaled up and
down mid-stream through :meth:`AppInstance.resize`: the output equals the plain-Python
reference exactly, and the instance counts and counters add up."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from agiledart.app import parse_spec
from agiledart.app.functions import builtin_resolver
from agiledart.local.reference import canonical, reference_outputs
from agiledart.runtime.execution import EngineConfig
from agiledart.runtime.execution.engines import make_engine
from agiledart.runtime.instance import AppInstance, Deployment

COUNT = 3_000
SPEC = parse_spec(
    {
        "name": "resize",
        "sources": [
            {
                "id": "src",
                "peer": "p",
                "connector": "generator",
                "params": {"dataset": "counter", "rate": 3_000, "count": COUNT, "keys": 23},
            }
        ],
        "operators": [
            {
                "id": "sums",
                "op": "window",
                "params": {"size_ms": 200, "key": "key", "aggregate": "sum", "field": "seq"},
                "inputs": ["src"],
            },
            {
                "id": "counts",
                "op": "aggregate",
                "params": {"key": "key", "aggregate": "count"},
                "inputs": ["src"],
            },
        ],
        "sinks": [
            {
                "id": "out",
                "peer": "p",
                "connector": "file",
                "params": {"path": "out.jsonl"},
                "inputs": ["sums", "counts"],
            }
        ],
    }
)


async def emitted(inst: AppInstance, n: int) -> None:
    for _ in range(3_000):  # 30 s at most: a broken build must not hang
        if inst.statistics()["sources"]["src"]["emitted"] >= n:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"the source did not emit {n} records")


async def run(tmp_path: Path) -> tuple[AppInstance, list[dict[str, Any]]]:
    engine = make_engine(EngineConfig(workers=2, offload_us=0), tmp_path / "code")
    deployment = Deployment(
        app_id="resize-1",
        spec=SPEC,
        hosts={"src": ("p",), "sums": ("p",), "counts": ("p",), "out": ("p",)},
        addresses={"p": ("127.0.0.1", 9)},
        scheduler=("127.0.0.1", 9),
    )
    done = asyncio.Event()

    async def sink_done(sink: str, info: dict[str, Any]) -> None:
        done.set()

    async def failed(error: str, lost: str | None) -> None:
        raise AssertionError(error)

    inst = AppInstance(
        deployment,
        me="p",
        links=None,  # type: ignore[arg-type]  # everything is local: no links
        resolve=builtin_resolver(),
        state_dir=tmp_path,
        on_sink_done=sink_done,
        on_failed=failed,
        engine=engine,
    )
    async with asyncio.TaskGroup() as group:
        engine.start(group)
        inst.start(group)
        await inst.wait_ready()
        inst.start_sources()
        plan = [(500, 3), (1_200, 2), (2_000, 4), (2_500, 1)]  # records out -> replicas
        for threshold, n in plan:
            await emitted(inst, threshold)
            await asyncio.gather(
                *(inst.resize(inst.segment_of[op], n).wait() for op in ("sums", "counts"))
            )
            assert inst.statistics()["operators"]["counts"]["instances"] == n
        await done.wait()
        stats = inst.statistics()
        await inst.aclose()
        await engine.aclose()
    path = tmp_path / "output" / "resize-1" / "out.jsonl"
    out = [json.loads(line) for line in path.read_text().splitlines()]
    return inst, [stats, *out]


async def test_keyed_state_follows_its_keys_through_every_resize(tmp_path: Path) -> None:
    _, (stats, *out) = await run(tmp_path)
    want = reference_outputs(SPEC)["out"]
    assert len(out) == len(want)
    assert canonical(out) == canonical(want)
    ops = stats["operators"]
    assert ops["counts"]["records_in"] == COUNT  # counters of retired replicas kept
    assert ops["sums"]["records_in"] == COUNT
    assert ops["counts"]["instances"] == 1
    assert ops["sums"]["late"] == 0
