"""Trace sampling (docs/traces.md): a fraction of tuples carry a trace id and
their source timestamp; the sink subtracts to get end-to-end latency.

Theory of operation: instead of drawing a uniform number per tuple, the sampler draws
the gap to the next sampled tuple from the geometric distribution with parameter
``rate``, so the per-tuple cost is one integer decrement. Same seed -> same samples.
"""

from __future__ import annotations

import math
import random
from typing import NamedTuple

from agiledart.dataplane.errors import DataPlaneUsageError

__all__ = ["Trace", "TraceSampler", "trace_latency"]


class Trace(NamedTuple):
    """A sampled tuple's trace; a plain tuple ``(trace_id, source_ts)``, so that the
    data path carries it at the cost of a tuple."""

    trace_id: int
    source_ts: float  # milliseconds, the source's clock


class TraceSampler:
    """Deterministic sampler: ``sample(now)`` returns a :class:`Trace` for ~``rate`` of calls."""

    __slots__ = ("_log1mp", "_rng", "_skip", "rate", "sampled", "seen")

    def __init__(self, *, rate: float = 0.05, seed: int = 0) -> None:
        if not 0.0 < rate <= 1.0:
            msg = f"trace rate must be in (0, 1], got {rate!r}"
            raise DataPlaneUsageError(msg)
        self.rate = rate
        self._rng = random.Random(seed)
        self._log1mp = math.log1p(-rate) if rate < 1.0 else 0.0
        self.seen = 0
        self.sampled = 0
        self._skip = self._draw()

    def _draw(self) -> int:
        if self._log1mp == 0.0:
            return 0
        u = 1.0 - self._rng.random()  # in (0, 1]
        return int(math.log(u) / self._log1mp)

    def sample(self, now: float) -> Trace | None:
        self.seen += 1
        if self._skip:
            self._skip -= 1
            return None
        self._skip = self._draw()
        self.sampled += 1
        return Trace(self._rng.getrandbits(63), now)

    def sample_batch(self, n: int, now: float) -> list[tuple[int, Trace]]:
        """:meth:`sample` for ``n`` tuples at once, as (index, trace) of the sampled ones;
        the same draws as ``n`` calls, at one step per sampled tuple."""
        out: list[tuple[int, Trace]] = []
        i = self._skip
        self.seen += n
        while i < n:
            self._skip = self._draw()
            self.sampled += 1
            out.append((i, Trace(self._rng.getrandbits(63), now)))
            i += 1 + self._skip
        self._skip = i - n
        return out

    def sample_count(self, n: int, now: float) -> list[Trace]:
        """Traces for about ``rate`` of ``n`` tuples whose places do not matter (a
        source's batch: its traces ride with the batch, not with a record): the
        expected count, its fraction rounded up at random; one draw a batch."""
        expected = n * self.rate
        k = int(expected)
        if self._rng.random() < expected - k:
            k += 1
        self.seen += n
        self.sampled += k
        bits, new = self._rng.getrandbits, tuple.__new__  # (Trace's own __new__ is slow)
        return [new(Trace, (bits(63), now)) for _ in range(k)]


def trace_latency(trace: Trace, now: float) -> float:
    """Sink-side end-to-end latency in ms (clocks assumed synchronised)."""
    return now - trace.source_ts
