"""``counter``: ``{"ts", "key", "seq"}`` with ``seq`` = 0, 1, 2, ... for exactly-once checks.

``key`` is one of ``keys`` names (``k0`` ...), drawn at random: a sink that sees every
``seq`` exactly once, and per-key counts equal to the generator's, saw no loss and no
duplication.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["CounterMaker"]

Record = dict[str, Any]
Timestamps = np.ndarray[Any, np.dtype[np.int64]]


class CounterMaker:
    def __init__(self, rng: np.random.Generator, *, keys: int = 16):
        if keys < 1:
            msg = f"need keys >= 1, got {keys}"
            raise TypeError(msg)
        self.names = [f"k{j}" for j in range(keys)]
        self.names_of = np.array(self.names, dtype=object)

    def chunk(self, rng: np.random.Generator, first: int, ts: Timestamps) -> list[Record]:
        names = self.names
        keys = self.names_of[rng.integers(0, len(names), len(ts))].tolist()
        return [
            {"ts": t, "key": k, "seq": i}
            for i, (t, k) in enumerate(zip(ts.tolist(), keys, strict=True), start=first)
        ]
