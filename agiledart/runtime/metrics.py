"""Per-instance load metrics over a sliding window (EdgeWise §4; scaling, paper §IV-C).

An :class:`InstanceMeter` watches one operator group's inbox and its executions:

* ``rate``: records fed per second;
* ``service_us``: execution time per record (what one record costs the worker);
* ``queue``: items waiting now; ``wait_ms``: how long the processed items had waited;
* ``worker_wait_ms``: of that, how long a turn waited for a free worker (EdgeWise's
  T_S, the schedule time; 0 where operators run in the peer loop or a process each);
* ``utilization`` rho = 1 - T_emptyQ / T_w: the share of the window during which the
  inbox was not empty (EdgeWise's definition: a queue that is never empty is
  saturated, whatever the worker does meanwhile);
* ``busy``: the share of the window spent executing.

Time is cut into one-second buckets, ``window_s`` of them are kept, so figures follow
the load within seconds and memory is constant. Pure bookkeeping: the caller passes
``now`` (a monotonic clock in seconds), which makes it testable without sleeping.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["Buckets", "InstanceMeter", "LatencyHistogram", "MeterReading", "quantile"]


def quantile(sorted_xs: list[float], q: float) -> float | None:
    """The ``q`` quantile of sorted values (nearest rank), to 3 decimals; None if empty."""
    if not sorted_xs:
        return None
    return round(sorted_xs[min(len(sorted_xs) - 1, int(q * len(sorted_xs)))], 3)


@dataclass(frozen=True, slots=True)
class MeterReading:
    rate: float
    service_us: float | None
    wait_ms: float | None
    worker_wait_ms: float | None
    utilization: float
    busy: float

    def as_dict(self) -> dict[str, float | None]:
        return {
            "rate": round(self.rate, 1),
            "service_us": None if self.service_us is None else round(self.service_us, 2),
            "wait_ms": None if self.wait_ms is None else round(self.wait_ms, 3),
            "worker_wait_ms": None
            if self.worker_wait_ms is None
            else round(self.worker_wait_ms, 3),
            "utilization": round(self.utilization, 4),
            "busy": round(self.busy, 4),
        }


class InstanceMeter:
    #: per bucket: records, busy s, non-empty s, waited s, items, worker wait s
    _FIELDS = 6

    def __init__(self, now: float, *, window_s: int = 10) -> None:
        if window_s < 1:
            msg = f"window_s must be >= 1, got {window_s}"
            raise ValueError(msg)
        self.window_s = window_s
        self.started = now
        self._buckets: dict[int, list[float]] = {}
        self._nonempty_since: float | None = None
        self._fed = False

    def _bucket(self, now: float) -> list[float]:
        second = int(now)
        b = self._buckets.get(second)
        if b is None:
            b = self._buckets[second] = [0.0] * self._FIELDS
            for old in [k for k in self._buckets if k < second - self.window_s]:
                del self._buckets[old]
        return b

    def _spread(self, start: float, end: float, field: int) -> None:
        """Add the interval [start, end) to ``field`` of the buckets it covers."""
        t = start
        while t < end:
            edge = min(end, int(t) + 1.0)
            self._bucket(t)[field] += edge - t
            t = edge

    def queued(self, now: float) -> None:
        """An item was put in an empty inbox (the first one starts the clock: the time
        an instance waits for its first input is not idleness)."""
        if not self._fed:
            self._fed = True
            self.started = now
        if self._nonempty_since is None:
            self._nonempty_since = now

    def drained(self, now: float) -> None:
        """The inbox became empty."""
        if self._nonempty_since is not None:
            self._spread(self._nonempty_since, now, 2)
            self._nonempty_since = None

    def executed(
        self, start: float, end: float, records: int, waited_s: float, *, worker_wait_s: float = 0
    ) -> None:
        """One turn: ``records`` executed from ``start`` to ``end``, after waiting
        ``waited_s`` in the queue, ``worker_wait_s`` of it for a worker."""
        self._spread(start, end, 1)
        b = self._bucket(start)
        b[0] += records
        b[3] += waited_s
        b[4] += 1
        b[5] += worker_wait_s

    def reading(self, now: float) -> MeterReading:
        span = min(float(self.window_s), max(now - self.started, 1e-9))
        lo = now - span
        if self._nonempty_since is not None:  # count the current non-empty stretch
            self._spread(self._nonempty_since, now, 2)
            self._nonempty_since = now
        totals = [0.0] * self._FIELDS
        for second, b in self._buckets.items():
            share = min(second + 1.0, now) - max(float(second), lo)  # of this bucket
            if share > 0:
                for i in range(self._FIELDS):
                    totals[i] += b[i] * share
        records, busy, nonempty, waited, items, worker_wait = totals
        return MeterReading(
            rate=records / span,
            service_us=busy / records * 1e6 if records else None,
            wait_ms=waited / items * 1e3 if items else None,
            worker_wait_ms=worker_wait / items * 1e3 if items else None,
            utilization=min(1.0, nonempty / span),
            busy=min(1.0, busy / span),
        )


class Buckets:
    """Per-bucket (not cumulative) counts of observations under fixed upper bounds,
    and their sum; the last count is for values above every bound."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value


class LatencyHistogram:
    """Cumulative counts of end-to-end latencies (ms) under fixed bounds: what the metrics
    endpoint exports as a Prometheus histogram. Every sample is counted once, in constant
    memory (the recent-samples window of ``status`` forgets; this does not)."""

    #: upper bounds, ms (a Prometheus bucket holds the samples <= its bound)
    BOUNDS_MS = (1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000)

    __slots__ = ("counts", "sum_ms")

    def __init__(self) -> None:
        self.counts = [0] * (len(self.BOUNDS_MS) + 1)  #: the last one: above every bound
        self.sum_ms = 0.0

    def observe(self, samples_ms: Iterable[float]) -> None:
        for ms in samples_ms:
            self.counts[bisect.bisect_left(self.BOUNDS_MS, ms)] += 1
            self.sum_ms += ms

    @property
    def count(self) -> int:
        return sum(self.counts)
