"""Keyed partitioning is stable across processes and balanced; round-robin cycles."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter

import pytest

from agiledart.dataplane import (
    DataPlaneUsageError,
    KeyPartitioner,
    RoundRobinPartitioner,
    stable_hash,
)

# Fixed values: if these change, every deployed partitioning changes with them.
EXPECTED = {
    "a": 7307683088587890394,
    "b": 4689656470459492944,
    "user-42": 14663645407944756740,
    42: 7926414779212984227,
    ("x", 1): 9191443074760197180,
}


@pytest.mark.parametrize(("key", "h"), list(EXPECTED.items()))
def test_fixed_hashes(key: object, h: int) -> None:
    assert stable_hash(key) == h
    assert KeyPartitioner(8)(key) == h % 8


def test_list_and_tuple_keys_agree() -> None:
    assert stable_hash(["x", 1]) == stable_hash(("x", 1))


def test_stable_across_processes_with_different_hash_seeds() -> None:
    code = "from agiledart.dataplane import stable_hash; print(stable_hash('user-42'))"
    outs = set()
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        outs.add(int(out.stdout))
    assert outs == {EXPECTED["user-42"]}


def test_balanced() -> None:
    n = 8
    p = KeyPartitioner(n)
    counts = Counter(p(f"key-{i}") for i in range(16000))
    assert set(counts) == set(range(n))
    assert max(counts.values()) < 1.1 * 2000
    assert min(counts.values()) > 0.9 * 2000


def test_round_robin() -> None:
    rr = RoundRobinPartitioner(3, start=2)
    assert [rr() for _ in range(7)] == [2, 0, 1, 2, 0, 1, 2]


def test_misuse() -> None:
    with pytest.raises(DataPlaneUsageError):
        KeyPartitioner(0)
    with pytest.raises(DataPlaneUsageError):
        RoundRobinPartitioner(0)
    with pytest.raises(DataPlaneUsageError):
        stable_hash(object())
