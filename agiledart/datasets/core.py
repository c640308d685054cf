"""Deterministic generator datasets: same (dataset, seed, params) -> same records.

Theory of operation. Record ``i`` (0-based) of a stream at ``rate`` records per second
has base event time ``start_ts + floor(i * 1000 / rate)`` ms, whatever the wall clock;
with ``disorder_ms > 0`` each record's ``ts`` is its base time plus a uniform jitter in
``[0, disorder_ms]``, so records arrive at most ``disorder_ms`` behind the largest
``ts`` seen (a watermark lag of ``disorder_ms`` never makes a record late). Records are
made in fixed chunks from a ``numpy.random.Generator`` seeded with ``seed`` (jitter
from an independent child stream), so a stream of ``count`` records is a prefix of the
same stream with a larger ``count``, and consumer batch sizes do not change the
records. A chunk is :data:`CHUNK` records, or about one second of the stream for slow
ones (:func:`chunk_size`, a function of ``rate`` only): a source replaying a few
records per second does not hold thousands of them in memory.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Protocol

import numpy as np

from agiledart.app.errors import DatasetError
from agiledart.app.spec import DATASETS

__all__ = [
    "CHUNK",
    "DATASETS",
    "MIN_CHUNK",
    "ChunkMaker",
    "chunk_size",
    "generate",
    "generate_batches",
    "generator_kwargs",
]

Record = dict[str, Any]
Timestamps = np.ndarray[Any, np.dtype[np.int64]]
CHUNK = 4096
#: The smallest chunk, for the slowest streams.
MIN_CHUNK = 64


def chunk_size(rate: float) -> int:
    """Records made at a time for a stream at ``rate``: the power of two at or above
    one second of it, between :data:`MIN_CHUNK` and :data:`CHUNK`."""
    size = MIN_CHUNK
    while size < CHUNK and size < rate:
        size *= 2
    return size


#: Keys of a generator source's params that are not dataset arguments.
_SOURCE_ONLY = frozenset({"dataset", "out_of_order_ms", "speedup", "overload"})


class ChunkMaker(Protocol):
    """One dataset's record factory, made once per stream."""

    def chunk(self, rng: np.random.Generator, first: int, ts: Timestamps) -> list[Record]:
        """``len(ts)`` records numbered from ``first``, with these event times (int64)."""
        ...


def _makers() -> Mapping[str, Any]:
    from agiledart.datasets.counter import CounterMaker
    from agiledart.datasets.taxi import TaxiMaker
    from agiledart.datasets.urban import UrbanMaker
    from agiledart.datasets.words import WordsMaker

    return {"urban": UrbanMaker, "taxi": TaxiMaker, "words": WordsMaker, "counter": CounterMaker}


def generator_kwargs(params: Mapping[str, Any]) -> dict[str, Any]:
    """The :func:`generate` keyword arguments held in a generator source's params."""
    return {k: v for k, v in params.items() if k not in _SOURCE_ONLY}


def generate_batches(
    dataset: str,
    *,
    seed: int = 0,
    count: int | None = None,
    rate: float,
    start_ts: int = 0,
    disorder_ms: int = 0,
    batch_size: int = CHUNK,
    **extra: Any,
) -> Iterator[list[Record]]:
    """Lists of up to ``batch_size`` records; unbounded when ``count`` is None."""
    makers = _makers()
    if dataset not in makers:
        msg = f"unknown dataset {dataset!r}; datasets: {', '.join(DATASETS)}"
        raise DatasetError(msg)
    if not rate > 0:
        msg = f"rate must be > 0 records/s, got {rate!r}"
        raise DatasetError(msg)
    if count is not None and count < 0:
        msg = f"count must be >= 0, got {count}"
        raise DatasetError(msg)
    if disorder_ms < 0 or batch_size < 1:
        msg = f"need disorder_ms >= 0 and batch_size >= 1, got {disorder_ms}, {batch_size}"
        raise DatasetError(msg)
    data_seq, jitter_seq = np.random.SeedSequence(seed).spawn(2)
    rng, jitter_rng = np.random.default_rng(data_seq), np.random.default_rng(jitter_seq)
    try:
        maker: ChunkMaker = makers[dataset](rng, **extra)
    except TypeError as e:
        msg = f"bad arguments for dataset {dataset!r}: {e}"
        raise DatasetError(msg) from None
    return _batches(maker, rng, jitter_rng, count, rate, start_ts, disorder_ms, batch_size)


def _batches(
    maker: ChunkMaker,
    rng: np.random.Generator,
    jitter_rng: np.random.Generator,
    count: int | None,
    rate: float,
    start_ts: int,
    disorder_ms: int,
    batch_size: int,
) -> Iterator[list[Record]]:
    first = 0
    pending: list[Record] = []
    chunk = chunk_size(rate)
    while count is None or first < count:
        idx = np.arange(first, first + chunk, dtype=np.int64)
        if isinstance(rate, int):
            base = idx * 1000 // rate
        else:
            base = np.floor(idx * (1000.0 / rate)).astype(np.int64)
        base += start_ts
        if disorder_ms:
            base += jitter_rng.integers(0, disorder_ms + 1, chunk)
        recs = maker.chunk(rng, first, base)
        n = chunk if count is None else min(chunk, count - first)
        if n < chunk:
            del recs[n:]
        first += chunk
        if batch_size == chunk and not pending:
            yield recs
            continue
        pending += recs
        while len(pending) >= batch_size:
            yield pending[:batch_size]
            del pending[:batch_size]
    if pending:
        yield pending


def generate(dataset: str, **kwargs: Any) -> Iterator[Record]:
    """One record at a time; same arguments as :func:`generate_batches`."""
    for batch in generate_batches(dataset, **kwargs):
        yield from batch
