"""The reader's tasks without Spark: pieces cover every line once, and Arrow's verdicts
on a chunk are the line-by-line rules' verdicts."""

from __future__ import annotations

import gzip
import random
from pathlib import Path

import pyarrow as pa
import pytest

from agiledart.analysis import parse
from agiledart.traces import TraceWriter

from .test_analysis_malformed import BAD_LINES


def _trace(directory: Path, peer: str = "p1") -> Path:
    """A trace with a record of every type, as a peer writes it."""
    with TraceWriter(directory, peer, zone="z1") as w:
        for i in range(300):
            w.emit("tuple", app="a", sink="s", trace_id=i, source_ts=0.0, sink_ts=1.0, latency_ms=i)
            w.emit("peer", event="joined", subject=f"p{i}", node_id=None, zone="z1")
            if i % 10 == 0:
                w.emit(
                    "placement",
                    app="a",
                    name="app",
                    strategy=None,
                    placement={"src": ["p1"], f"op-{i}": ["p2", "p3"]},
                    paths=[["p1", "p2"]],
                )
                w.emit(
                    "opstats",
                    app="a",
                    operator="op",
                    records_in=i,
                    records_out=i,
                    rate_in=1.0,
                    queue=0,
                    utilization=None,
                    service_us=None,
                )
                w.emit(
                    "delivery",
                    app="a",
                    packet=str(i),
                    origin="n0",
                    dest="n9",
                    k=i,
                    path=["n0", "n9"],
                    attempts=1,
                    delay_ms=2.5,
                    optimal_ms=None,
                    policy="agiledart",
                    graph=None,
                )
    return directory / peer / "trace-000001.ndjson"


def _rows(result: parse.PieceResult) -> dict[str, list[dict[str, object]]]:
    return {kind: pa.concat_tables(tables).to_pylist() for kind, tables in result.tables.items()}


def test_the_pieces_of_a_file_hold_each_line_once(tmp_path: Path) -> None:
    path = _trace(tmp_path)
    whole = parse.read_piece(parse.Piece(str(path), 0, -1))
    rng = random.Random(7)
    for _ in range(25):
        size = rng.randint(1, 4000)
        result = parse.PieceResult()
        for piece in parse.pieces([path], piece_bytes=size):
            part = parse.read_piece(piece, chunk_bytes=rng.randint(1, 3000))
            for kind, tables in part.tables.items():
                result.tables.setdefault(kind, []).extend(tables)
            assert not part.malformed, (size, piece)
        assert _rows(result) == _rows(whole)
    assert sum(len(rows) for rows in _rows(whole).values()) == len(path.read_text().splitlines())


def _fast_all(data: bytes, result: parse.PieceResult) -> bool:
    """Whether Arrow judged every line of ``data`` (each type's lines apart)."""
    kinds, others = parse._by_kind(data)
    fast = [parse._fast(kind, b"\n".join(lines), result) for kind, lines in kinds.items()]
    return not others and all(fast)


def test_arrow_and_the_line_rules_agree_on_valid_lines(tmp_path: Path) -> None:
    data = _trace(tmp_path).read_bytes()
    fast, slow, judged = parse.PieceResult(), parse.PieceResult(), parse.PieceResult()
    assert _fast_all(data, fast)
    parse._slow(data, slow)
    parse._judge(data, judged)
    assert _rows(fast) == _rows(slow) == _rows(judged)
    assert fast.tally == slow.tally == judged.tally
    placement = _rows(fast)["placement"][1]
    assert placement["placement"] == [("src", ["p1"]), ("op-10", ["p2", "p3"])]
    assert placement["strategy"] is None


@pytest.mark.parametrize("reason", list(BAD_LINES))
def test_a_malformed_line_is_judged_line_by_line_with_its_type(tmp_path: Path, reason: str) -> None:
    good = _trace(tmp_path).read_bytes()
    for bad in BAD_LINES[reason]:
        line = bad.encode("utf-8", "surrogateescape") + b"\n"
        assert not _fast_all(line, parse.PieceResult())
        result = parse.PieceResult()
        parse._judge(good + line + good, result)
        assert result.malformed == {reason: 1}
        assert result.examples[0][0] == reason
        assert sum(len(rows) for rows in _rows(result).values()) == 2 * len(good.splitlines())


def test_lines_are_sorted_by_type_as_the_writer_starts_them() -> None:
    lines = [
        b'{"v":1,"type":"peer","ts":1.0}',
        b"",
        b'  {"type":"peer","v":1}',
        b'{"v":1,"type":"tuplex","ts":1.0}',
        b'{"v":1,"type":"tu\\u0070le"}',
        b'{"v":1,"type":"tuple"}',
        b"   ",
    ]
    kinds, others = parse._by_kind(b"\n".join(lines))
    assert kinds == {"peer": [lines[0]], "tuple": [lines[5]]}
    assert sorted(others) == sorted([lines[2], lines[3], lines[4]])


def test_a_field_of_another_type_is_ignored() -> None:
    line = (
        '{"v":1,"type":"scheduler","ts":1.0,"peer":"p","zone":"z","scheduler":"s",'
        '"event":"e","apps":2,"hop":"not a number"}'
    )
    assert parse.judge_line(line)[0] == "scheduler"
    assert _fast_all(line.encode(), parse.PieceResult())


def test_line_rules_follow_sparks_json_reader() -> None:
    head = '{"v":1,"type":"scheduler","ts":1.0,"peer":"p"'
    assert parse.judge_line(head + ',"zone":7,"scheduler":true,"event":"e","apps":2}')[0] == (
        "scheduler"
    )  # numbers and booleans where strings belong are their text
    assert parse.judge_line(head + ',"zone":"z","scheduler":"s","event":"e","apps":2.0}')[0] == (
        "bad_fields"
    )  # a float is no integer
    assert parse.judge_line(head + ',"zone":"z","scheduler":"s","event":"e","apps":true}')[0] == (
        "bad_fields"
    )
    assert parse.judge_line('{"v":"1","type":"meta","ts":1.0,"peer":"p"}')[0] == "bad_fields"
    assert parse.judge_line('{"v":3,"type":"nope"}')[0] == "unknown_type"
    assert parse.judge_line('"text"')[0] == "not_json"


def test_a_cut_gzip_file_is_read_up_to_the_cut(tmp_path: Path) -> None:
    lines = [
        f'{{"v":1,"type":"peer","ts":{i}.0,"peer":"p","event":"e","subject":"s"}}\n'
        for i in range(2000)
    ]
    blob = gzip.compress("".join(lines).encode()) + gzip.compress(lines[0].encode())
    whole = tmp_path / "whole.ndjson.gz"
    whole.write_bytes(blob)
    assert (
        parse.read_piece(parse.Piece(str(whole), 0, -1), chunk_bytes=512).tally[("peer", "p")][0]
        == 2001
    )
    cut = tmp_path / "cut.ndjson.gz"
    cut.write_bytes(blob[: len(blob) // 2])
    result = parse.read_piece(parse.Piece(str(cut), 0, -1), chunk_bytes=512)
    read = result.tally[("peer", "p")][0]
    assert 0 < read < 2000
    assert sum(result.malformed.values()) <= 1  # at most the line the cut went through


def test_both_ways_of_judging_leave_unread_optional_fields_alone() -> None:
    line = (
        '{"v":1,"type":"shuffle","ts":1.0,"peer":"p","app":"a","packet":"1","origin":"n0",'
        '"dest":"n1","hop":1,"node":"n0","next":"n1","outcome":"ok","delay_ms":2.0,'
        '"policy":"agiledart","graph":null,"tau":1,"omega":"high","j":[1],"extra":{"x":1}}'
    )
    assert "omega" not in parse.CHECKED
    fast, slow = parse.PieceResult(), parse.PieceResult()
    assert parse._fast("shuffle", line.encode(), fast)
    parse._slow(line.encode() + b"\n", slow)
    assert _rows(fast) == _rows(slow)
    assert _rows(fast)["shuffle"][0]["delay_ms"] == 2.0
    # a required field that no table reads is still checked
    assert parse.judge_line(line.replace('"tau":1', '"tau":1.5'))[0] == "bad_fields"
    assert not parse._fast("shuffle", line.replace('"tau":1', '"tau":1.5').encode(), fast)


def test_records_are_handed_on_as_they_pile_up_and_counted_once(tmp_path: Path) -> None:
    path = _trace(tmp_path)
    whole = parse.read_piece(parse.Piece(str(path), 0, -1), chunk_bytes=2000)
    handed: list[dict[str, pa.Table]] = []
    flushed = parse.read_piece(
        parse.Piece(str(path), 0, -1), chunk_bytes=2000, flush=handed.append, flush_bytes=4000
    )
    assert len(handed) > 3
    assert not flushed.tables
    assert flushed.tally == whole.tally
    merged = parse.PieceResult()
    for tables in handed:
        for kind, table in tables.items():
            merged.add(kind, table)
    assert _rows(merged) == _rows(whole)


def test_a_task_writes_one_parquet_file_per_type_and_partial(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    from agiledart.analysis.partials import FOLDED, PARTIALS, Windows

    path = _trace(tmp_path / "traces")
    parts = tmp_path / "parts"
    done = parse.write_piece(3, parse.Piece(str(path), 0, -1), str(parts), Windows(0.0, 1000.0))
    whole = _rows(parse.read_piece(parse.Piece(str(path), 0, -1)))
    for kind, rows in whole.items():
        assert sum(n for (k, _), (n, _, _) in done["tally"].items() if k == kind) == len(rows)
        for name, partial in PARTIALS.items():
            if partial.kind == kind:
                found = pq.read_table(parts / "partials" / name / "part-000003.parquet")
                assert found.schema == partial.written
        if kind in FOLDED:
            assert not (parts / kind).exists()  # summed up in the partials only
            continue
        table = pq.read_table(parts / kind / "part-000003.parquet")
        assert table.to_pylist() == rows
    if "tuple" in whole:
        latency = pq.read_table(parts / "partials" / "latency" / "part-000003.parquet")
        assert sum(latency["n"].to_pylist()) == len(whole["tuple"])
    assert done["malformed"] == {}
