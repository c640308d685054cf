"""The percentiles the analysis states: histograms counted apart per piece (numpy, as
the reader's tasks count them) and merged by Spark give every quantile within the
stated relative accuracy of the exact one, negative and zero values included; withheld
below the sample threshold."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from agiledart.analysis.sketch import ALPHA, MIN_SAMPLES, ZERO, codes, quantiles, value

from .traces import percentile_fits

LEVELS = (0.0, 0.01, 0.25, 0.5, 0.95, 0.99, 1.0)
PIECES = 3


@pytest.fixture(scope="module")
def values() -> dict[str, list[float]]:
    rng = random.Random(7)
    return {
        "one": [3.0],
        "few": [rng.uniform(1, 9) for _ in range(MIN_SAMPLES - 1)],
        "ties": [rng.choice([1.5, 2.5, 2.5]) for _ in range(40)],
        "skewed": [rng.lognormvariate(2.0, 1.0) for _ in range(30_000)],
        "signed": [rng.gauss(0.0, 5.0) for _ in range(500)] + [0.0] * 30 + [1e-12] * 3,
        "huge": [rng.uniform(1e6, 1e9) for _ in range(200)],
    }


def test_every_value_is_within_alpha_of_its_buckets_value() -> None:
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.lognormal(0.0, 6.0, 20_000), -rng.lognormal(0.0, 6.0, 20_000)])
    shown = np.array([value(int(c)) for c in codes(x)])
    assert np.all(np.abs(shown - x) <= ALPHA * np.abs(x) * (1 + 1e-9) + ZERO)
    assert np.all(shown[np.abs(x) < ZERO] == 0.0)
    order = np.argsort(x)
    assert np.all(np.diff(codes(x)[order]) >= 0)  # codes sort as the values do


def test_merged_histograms_give_every_quantile_within_alpha(
    spark: Any, values: dict[str, list[float]]
) -> None:
    rows = []
    for group, xs in values.items():
        for piece in range(PIECES):  # each piece counts its own share, as a task does
            part = np.asarray(xs[piece::PIECES])
            found, n = np.unique(codes(part), return_counts=True)
            rows += [(group, int(c), int(k)) for c, k in zip(found, n, strict=True)]
    frame = spark.createDataFrame(rows, "g string, code long, n long").repartition(3)
    names = [f"q{i}" for i in range(len(LEVELS))]
    got = {r["g"]: r for r in quantiles(frame, ["g"], LEVELS, names).collect()}
    assert set(got) == set(values)
    for group, xs in values.items():
        assert got[group]["count"] == len(xs)
        for q, name in zip(LEVELS, names, strict=True):
            assert percentile_fits(got[group][name], xs, q), (group, q, got[group][name])
    assert got["few"]["q3"] is None
    assert got["one"]["q6"] is None


def test_a_group_split_over_many_batches_merges_whole() -> None:
    """The Python workers' merge (:func:`quantiles`' function) sees a partition a batch
    at a time: a group whose rows span batches, one row per batch or more, gives the
    figures of all its rows (what it holds of a group stays one row)."""
    from agiledart.analysis.sketch import _Merge

    rng = np.random.default_rng(1)
    rows, seen = [], {}
    for group in range(4):
        for _ in range(7):  # pieces
            x = rng.gamma(2.0, 8.0, 50)
            seen.setdefault(group, []).extend(x.tolist())
            found, n = np.unique(codes(x), return_counts=True)
            rows.append({"g": group, "codes": found.tolist(), "counts": n.tolist(), "sum": x.sum()})
    table = pa.Table.from_pylist(
        rows,
        schema=pa.schema(
            [
                ("g", pa.int64()),
                ("codes", pa.list_(pa.int32())),
                ("counts", pa.list_(pa.int32())),
                ("sum", pa.float64()),
            ]
        ),
    )
    merge = _Merge(["g"], [0.5, 0.99], ["p50", "p99"], {"mean": ("mean", "sum")})
    for size in (1, 3, 100):
        batches = merge(iter(table.to_batches(max_chunksize=size)))
        got = pa.Table.from_batches(list(batches)).to_pylist()
        assert [r["g"] for r in got] == list(range(4))
        for r in got:
            xs = sorted(seen[r["g"]])
            assert r["count"] == len(xs)
            assert percentile_fits(r["p99"], xs, 0.99)
            assert percentile_fits(r["p50"], xs, 0.5)
            assert abs(r["mean"] - float(np.mean(xs))) < 1e-9
