"""A dead-letter sink in process: letters are JSON-safe copies of the records, a file is
appended to, and a sink that cannot write is a problem with its letters counted as
lost, never an exception; a path outside the peer's data root is refused."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from agiledart.app.spec import DeadLetterSpec
from agiledart.runtime.confine import DataPolicy, PathNotAllowed
from agiledart.runtime.deadletters import DeadLetters, letter


def open_letters(root: Path, path: str) -> DeadLetters:
    policy = DataPolicy.of(root)
    spec = DeadLetterSpec(connector="file", params={"path": path, "flush_ms": 0})
    return DeadLetters(
        spec,
        app="app-1",
        op="parse",
        peer="gw-1",
        out_dir=policy.sink_dir("app-1"),
        brokers=None,
        policy=policy,
    )


def failed(seq: int) -> dict[str, Any]:
    return {"type": "KeyError", "message": "'value'", "record": {"ts": seq, "seq": seq}}


def test_a_letter_is_json_safe_and_keeps_the_record() -> None:
    record = {"ts": 5, "raw": b"\x00\xff", "x": math.nan, "nested": {"inf": math.inf}}
    got = letter(
        {"type": "ValueError", "message": "bad", "record": record},
        app="a",
        op="o",
        peer="p",
        ts=7,
    )
    assert got == {
        "app": "a",
        "op": "o",
        "peer": "p",
        "error_type": "ValueError",
        "message": "bad",
        "record": {"ts": 5, "raw": "00ff", "x": None, "nested": {"inf": None}},
        "ts": 7,
    }
    tupled = {"type": "E", "message": "", "record": {(1, 2): 3}}
    odd = letter(tupled, app="a", op="o", peer="p", ts=0)
    assert odd["record"] == "{(1, 2): 3}"  # JSON has no tuple keys: its repr


def test_a_dead_letter_file_is_per_peer_and_appended_to(tmp_path: Path) -> None:
    first = open_letters(tmp_path, "bad/{op}-{peer}.jsonl")
    first.write([failed(1), failed(2)], ts=100)
    first.close()
    again = open_letters(tmp_path, "bad/{op}-{peer}.jsonl")  # a recovery's new instance
    again.write([failed(3)], ts=200)
    info = again.info()
    again.close()
    path = tmp_path / "output" / "app-1" / "bad" / "parse-gw-1.jsonl"
    assert info["path"] == str(path)
    assert (info["written"], info["lost"], info["problem"]) == (1, 0, False)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(x["record"]["seq"], x["ts"]) for x in lines] == [(1, 100), (2, 100), (3, 200)]


def test_a_dead_letter_file_that_cannot_be_made_is_a_problem_not_an_error(
    tmp_path: Path,
) -> None:
    (tmp_path / "output" / "app-1").mkdir(parents=True)
    (tmp_path / "output" / "app-1" / "bad").write_text("a file where a folder should be")
    letters = open_letters(tmp_path, "bad/{op}.jsonl")
    letters.write([failed(1), failed(2)], ts=1)  # never raises
    info = letters.info()
    assert info["problem"]
    assert info["lost"] == 2
    assert "cannot write" in info["error"]
    letters.close()


def test_a_dead_letter_path_outside_the_data_root_is_refused(tmp_path: Path) -> None:
    with pytest.raises(PathNotAllowed):
        open_letters(tmp_path / "root", str(tmp_path / "elsewhere.jsonl"))
