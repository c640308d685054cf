"""Barrier alignment, source replay offsets and file sink commits, without processes."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agiledart.app.spec import SinkSpec, SourceSpec
from agiledart.runtime.connectors import FileSink, Source
from agiledart.runtime.epochs import Alignment
from agiledart.runtime.recovery import Uplink

A, B, C = ("op", "p1"), ("op", "p2"), ("src", "p3")


def test_an_epoch_aligns_once_every_open_channel_passed_its_barrier() -> None:
    align = Alignment([A, B, C])
    assert align.barrier(A, 1) is None
    assert align.blocked(A)
    assert not align.blocked(B)
    assert align.barrier(C, 1) is None
    assert align.barrier(B, 1) == 1
    assert not align.blocked(A)  # released
    assert align.barrier(B, 2) is None  # the next epoch starts over


def test_a_finished_channel_is_not_waited_for() -> None:
    align = Alignment([A, B])
    assert align.barrier(A, 3) is None
    assert align.finish(B) == 3  # B ended before barrier 3: the epoch is complete
    assert align.barrier(A, 4) == 4  # and later epochs need A only


@given(st.permutations([A, B, C]), st.integers(1, 100))
def test_alignment_completes_exactly_on_the_last_barrier(
    order: list[tuple[str, str]], e: int
) -> None:
    align = Alignment([A, B, C])
    results = [align.barrier(ch, e) for ch in order]
    assert results == [None, None, e]


def test_an_unknown_channel_joins_the_alignment() -> None:
    align = Alignment([A])
    assert align.barrier(B, 1) is None  # now A is awaited as well
    assert align.barrier(A, 1) == 1


def counter_source(tmp_path: Path, skip: int) -> Source:
    spec = SourceSpec(
        id="s",
        peer="p",
        connector="generator",
        params={"dataset": "counter", "count": 2500, "keys": 4, "seed": 3, "rate": 10**6},
    )
    return Source(spec, base_dir=tmp_path, skip=skip)


def replay(source: Source) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []

    async def emit(records: list[dict[str, object]]) -> None:
        out.extend(records)

    asyncio.run(source.run(emit))
    return out


@pytest.mark.parametrize("skip", [0, 1, 999, 1000, 1001, 2500, 9999])
def test_a_restored_source_resumes_after_its_offset(tmp_path: Path, skip: int) -> None:
    whole = replay(counter_source(tmp_path, 0))
    source = counter_source(tmp_path, skip)
    assert replay(source) == whole[skip:]
    assert source.stats.emitted == len(whole)


def test_a_restored_file_sink_keeps_what_was_committed(tmp_path: Path) -> None:
    spec = SinkSpec(
        id="k", peer="p", connector="file", inputs=("x",), params={"path": "o.csv", "format": "csv"}
    )
    sink = FileSink(spec, out_dir=tmp_path)
    sink.write([{"a": 1, "b": 2}, {"a": 3, "b": 4}])
    committed = sink.commit()
    sink.write([{"a": 5, "b": 6}])  # after the checkpoint: rolled back
    sink.close()
    again = FileSink(spec, out_dir=tmp_path, resume=committed)
    assert again.stats.records == 2
    again.write([{"a": 5, "b": 7}])
    again.close()
    assert (tmp_path / "o.csv").read_text() == "a,b\n1,2\n3,4\n5,7\n"
    jspec = SinkSpec(id="j", peer="p", connector="file", inputs=("x",), params={"path": "o.jsonl"})
    sink = FileSink(jspec, out_dir=tmp_path)
    sink.write([{"a": 1}])
    committed = sink.commit()
    sink.write([{"a": 2}])
    sink.close()
    again = FileSink(jspec, out_dir=tmp_path, resume=committed)
    again.close()
    lines = (tmp_path / "o.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [{"a": 1}]


def test_an_uplink_paces_transfers_one_after_another() -> None:
    async def run() -> float:
        link = Uplink(1_000_000)  # 1 MB/s
        loop = asyncio.get_running_loop()
        t = loop.time()
        await asyncio.gather(link.send(100_000), link.send(100_000))
        return loop.time() - t

    assert asyncio.run(run()) >= 0.19  # two 0.1 s transfers queue on one link
    with pytest.raises(ValueError, match="positive"):
        Uplink(0)
