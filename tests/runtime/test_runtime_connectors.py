"""Source replay (pacing, back-pressure, shedding) and file / stdout sinks."""

from __future__ import annotations

import asyncio
import io
import json
import math
from pathlib import Path
from typing import Any

import pytest

from agiledart.app import parse_spec
from agiledart.app.errors import ExecutionError
from agiledart.app.spec import SinkSpec, SourceSpec
from agiledart.datasets import read_file
from agiledart.local.executor import source_batches
from agiledart.operators import Record
from agiledart.runtime.connectors import (
    FileSink,
    ReplaySchedule,
    Source,
    StdoutSink,
    json_line,
    open_sink,
)


class FakeTime:
    """A clock that only moves when the source sleeps or a test advances it."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, dt: float) -> None:
        assert dt > 0
        self.sleeps.append(dt)
        self.now += dt
        await asyncio.sleep(0)


def source_spec(connector: str = "generator", **params: Any) -> SourceSpec:
    return parse_spec(
        {
            "name": "t",
            "sources": [{"id": "src", "peer": "p", "connector": connector, "params": params}],
            "sinks": [{"id": "out", "peer": "p", "connector": "stdout", "inputs": ["src"]}],
        }
    ).sources[0]


def sink_spec(connector: str = "file", **params: Any) -> SinkSpec:
    return parse_spec(
        {
            "name": "t",
            "sources": [
                {"id": "src", "peer": "p", "connector": "generator",
                 "params": {"dataset": "counter", "rate": 10, "count": 1}}
            ],
            "sinks": [{"id": "out", "peer": "p", "connector": connector, "inputs": ["src"],
                       "params": params}],
        }
    ).sinks[0]  # fmt: skip


class Collector:
    """An ``emit`` that keeps batches, can block (advance fake time), records when."""

    def __init__(self, clock: FakeTime | None = None, block: dict[int, float] | None = None):
        self.batches: list[list[Record]] = []
        self.times: list[float] = []
        self.clock = clock
        self.block = block or {}

    @property
    def records(self) -> list[Record]:
        return [r for b in self.batches for r in b]

    async def __call__(self, batch: list[Record]) -> None:
        if self.clock is not None:
            self.times.append(self.clock.now)
            self.clock.now += self.block.get(len(self.batches), 0.0)
        self.batches.append(batch)
        await asyncio.sleep(0)


def make_source(spec: SourceSpec, fake: FakeTime, tmp_path: Path, **kw: Any) -> Source:
    return Source(spec, base_dir=tmp_path, clock=fake, sleep=fake.sleep, **kw)


# --- the schedule -----------------------------------------------------------------


def test_replay_schedule() -> None:
    s = ReplaySchedule(start=10.0, rate=100.0)
    assert s.due(9.0) == 0
    assert s.due(10.0) == 1
    assert s.due(10.015) == 2
    assert s.due(11.0) == 101
    assert s.due_at(0) == 10.0
    assert s.due(s.due_at(37)) == 38
    assert s.overdue(11.0, 0.5) == 50
    assert s.overdue(10.0, 0.5) == 0
    unpaced = ReplaySchedule(start=0.0, rate=None)
    assert unpaced.due(0.0) > 10**12
    assert unpaced.overdue(100.0, 0.0) == 0


# --- sources ----------------------------------------------------------------------


async def test_generator_source_replays_source_batches(tmp_path: Path) -> None:
    spec = source_spec(dataset="urban", rate=2000, count=2500, seed=7, disorder_ms=20)
    fake = FakeTime()
    src = make_source(spec, fake, tmp_path, batch_size=300)
    emit = Collector(fake)
    await src.run(emit)
    expected = [r for b in source_batches(spec, batch_size=300) for r in b]
    assert emit.records == expected
    assert all(len(b) <= 300 for b in emit.batches)
    st = src.stats
    assert (st.emitted, st.batches, st.delayed, st.shed) == (2500, len(emit.batches), 0, 0)
    assert st.finished
    # never early: when a batch goes out, all of its records are due
    sent = 0
    for t, batch in zip(emit.times, emit.batches, strict=True):
        sent += len(batch)
        assert sent <= math.floor(t * 2000 + 1e-6) + 1
    assert fake.now >= 2499 / 2000


async def test_source_runs_once(tmp_path: Path) -> None:
    fake = FakeTime()
    src = make_source(source_spec(dataset="counter", rate=10, count=2), fake, tmp_path)
    await src.run(Collector())
    with pytest.raises(ExecutionError, match="runs once"):
        await src.run(Collector())


async def test_file_sources_relative_to_base_dir(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    lines = [json.dumps({"ts": t, "v": t * 2}) for t in range(50)]
    lines[10] = "{broken"
    (tmp_path / "data" / "in.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "in.csv").write_text("ts,key,n\n1,a,2\n2,b,3.5\n3,a,\n")

    fake = FakeTime()
    src = make_source(source_spec("file", path="data/in.jsonl"), fake, tmp_path, batch_size=7)
    emit = Collector(fake)
    await src.run(emit)
    assert [r["ts"] for r in emit.records] == [t for t in range(50) if t != 10]
    assert (src.stats.emitted, src.stats.parse_errors, src.stats.finished) == (49, 1, True)
    assert fake.sleeps == []  # no rate: unpaced

    src = make_source(source_spec("file", path="in.csv"), fake, tmp_path)
    emit = Collector()
    await src.run(emit)
    assert emit.records == [
        {"ts": 1, "key": "a", "n": 2},
        {"ts": 2, "key": "b", "n": 3.5},
        {"ts": 3, "key": "a", "n": None},
    ]


async def test_paced_file_source(tmp_path: Path) -> None:
    (tmp_path / "in.jsonl").write_text("".join(f'{{"ts":{t}}}\n' for t in range(20)))
    fake = FakeTime()
    src = make_source(source_spec("file", path="in.jsonl", rate=10), fake, tmp_path)
    emit = Collector(fake)
    await src.run(emit)
    assert [r["ts"] for r in emit.records] == list(range(20))
    assert emit.times[-1] == pytest.approx(1.9)


async def test_missing_file_and_mqtt(tmp_path: Path) -> None:
    src = Source(source_spec("file", path="nope.csv"), base_dir=tmp_path)
    with pytest.raises(ExecutionError, match=r"'src'.*nope\.csv"):
        await src.run(Collector())
    with pytest.raises(ExecutionError, match="needs the peer's broker pool"):
        Source(source_spec("mqtt", topic="t"), base_dir=tmp_path)
    with pytest.raises(ExecutionError, match="overload"):
        Source(source_spec(dataset="counter", rate=1), base_dir=tmp_path, overload="drop")


async def test_blocking_emit_counts_delayed_and_loses_nothing(tmp_path: Path) -> None:
    spec = source_spec(dataset="counter", rate=100, count=500)
    fake = FakeTime()
    src = make_source(spec, fake, tmp_path, batch_size=50, late_ms=100)
    emit = Collector(fake, block={0: 2.0})  # the first emit blocks for 2 s
    await src.run(emit)
    assert [r["seq"] for r in emit.records] == list(range(500))
    # record 0 handed on at 2.0 s; records 1..189 (due before 1.9 s) caught up at 2.0 s
    assert (src.stats.emitted, src.stats.delayed, src.stats.shed) == (500, 190, 0)


async def test_shed_policy_skips_what_is_too_late(tmp_path: Path) -> None:
    spec = source_spec(dataset="counter", rate=100, count=1000)
    fake = FakeTime()
    src = make_source(spec, fake, tmp_path, batch_size=50, overload="shed", max_lag_s=0.5)
    emit = Collector(fake, block={0: 3.0})
    await src.run(emit)
    st = src.stats
    # at 3.0 s, records due before 2.5 s (1..249) are shed; the rest go on
    assert st.shed == 249
    assert st.emitted + st.shed == 1000
    assert [r["seq"] for r in emit.records] == [0, *range(250, 1000)]
    assert st.delayed == 1 + 40  # record 0, and 250..289 (due before 2.9 s)
    assert st.finished


async def test_unbounded_generator_can_be_cancelled(tmp_path: Path) -> None:
    spec = source_spec(dataset="counter", rate=1_000_000)
    src = Source(spec, base_dir=tmp_path, batch_size=100)
    enough = asyncio.Event()
    seen: list[Record] = []

    async def emit(batch: list[Record]) -> None:
        seen.extend(batch)
        if len(seen) >= 10_000:
            enough.set()

    task = asyncio.create_task(src.run(emit))
    await enough.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not src.stats.finished
    assert src.stats.emitted == len(seen) >= 10_000
    assert [r["seq"] for r in seen] == list(range(len(seen)))


async def test_cancel_while_reading_a_file_closes_it(tmp_path: Path) -> None:
    (tmp_path / "in.jsonl").write_text("".join(f'{{"ts":{t}}}\n' for t in range(100)))
    fake = FakeTime()
    src = make_source(source_spec("file", path="in.jsonl", rate=10), fake, tmp_path)
    emit = Collector(fake)
    five = asyncio.Event()

    async def emit_and_count(batch: list[Record]) -> None:
        await emit(batch)
        if len(emit.records) >= 5:
            five.set()

    task = asyncio.create_task(src.run(emit_and_count))
    await five.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task  # an unclosed file would be a ResourceWarning, an error here


# --- sinks ------------------------------------------------------------------------


def test_jsonl_file_sink_round_trip(tmp_path: Path) -> None:
    records = [{"ts": i, "city": "c", "value": i / 3, "tags": ["a", i]} for i in range(10)]
    sink = open_sink(sink_spec(path="out/deep/x.jsonl"), out_dir=tmp_path)
    assert sink.path == tmp_path / "out" / "deep" / "x.jsonl"
    sink.write(records[:4])
    sink.write([])
    sink.write(records[4:])
    sink.flush()  # visible before close
    assert list(read_file(sink.path, "jsonl")) == records
    text = sink.path.read_text()
    assert text.splitlines()[0] == json.dumps(records[0], separators=(",", ":"), sort_keys=True)
    assert (sink.stats.records, sink.stats.batches, sink.stats.bytes) == (10, 2, len(text))
    sink.close()
    sink.close()  # idempotent
    with pytest.raises(ExecutionError, match="closed"):
        sink.write(records)


def test_file_sink_absolute_path(tmp_path: Path) -> None:
    target = tmp_path / "abs" / "y.jsonl"
    sink = open_sink(sink_spec(path=str(target)), out_dir=tmp_path / "elsewhere")
    sink.write([{"ts": 1}])
    sink.close()
    assert target.read_text() == '{"ts":1}\n'


def test_non_finite_floats_and_bytes_in_json(tmp_path: Path) -> None:
    sink = open_sink(sink_spec(path="x.jsonl"), out_dir=tmp_path)
    sink.write(
        [
            {"ts": 1, "a": math.nan, "b": math.inf, "c": [-math.inf, 1.5], "d": {"e": math.nan}},
            {"ts": 2, "raw": b"\x00\xffA"},
        ]
    )
    sink.close()
    assert [json.loads(line) for line in (tmp_path / "x.jsonl").read_text().splitlines()] == [
        {"ts": 1, "a": None, "b": None, "c": [None, 1.5], "d": {"e": None}},
        {"ts": 2, "raw": "00ff41"},
    ]
    assert json_line({"x": 1.0}) == '{"x":1.0}'


def test_csv_file_sink(tmp_path: Path) -> None:
    sink = open_sink(sink_spec(path="out.csv"), out_dir=tmp_path)
    assert isinstance(sink, FileSink)
    assert sink.format == "csv"
    sink.write([{"ts": 1, "key": "a", "n": 2}, {"ts": 2, "key": "b, c", "n": 3.5}])
    sink.write([{"ts": 3, "key": "d", "extra": 1}, {"ts": 4, "key": "e", "n": math.nan}])
    sink.close()
    assert (tmp_path / "out.csv").read_text() == ('key,n,ts\na,2,1\n"b, c",3.5,2\nd,,3\ne,,4\n')
    assert list(read_file(tmp_path / "out.csv", "csv")) == [
        {"key": "a", "n": 2, "ts": 1},
        {"key": "b, c", "n": 3.5, "ts": 2},
        {"key": "d", "n": None, "ts": 3},
        {"key": "e", "n": None, "ts": 4},
    ]
    assert sink.stats.records == 4


def test_stdout_sink() -> None:
    out = io.StringIO()
    sink = open_sink(sink_spec("stdout"), out_dir=Path("unused"), stdout=out)
    assert isinstance(sink, StdoutSink)
    assert sink.path is None
    sink.write([{"ts": 1, "b": "é"}, {"ts": 2, "a": math.nan}])
    sink.flush()
    assert out.getvalue() == '{"b":"\\u00e9","ts":1}\n{"a":null,"ts":2}\n'
    assert sink.stats.bytes == len(out.getvalue().encode())
    sink.close()
    sink.close()
    assert not out.closed


def test_open_sink_errors(tmp_path: Path) -> None:
    with pytest.raises(ExecutionError, match="mqtt connector needs the peer's broker pool"):
        open_sink(sink_spec("mqtt", topic="t"), out_dir=tmp_path)
    (tmp_path / "dir.jsonl").mkdir()
    with pytest.raises(ExecutionError, match=r"sink 'out': cannot write"):
        open_sink(sink_spec(path="dir.jsonl"), out_dir=tmp_path)
