"""``urban``: environmental sensor readings from seven cities (paper §VII, [77]).

Each record is one reading ``{"ts", "city", "metric", "value", "sensor", "id"}`` of one
of six metrics (pollution, dust, light, sound, temperature, humidity) by one of
``sensors`` sensors per city. Values scatter around a per-city baseline; about 0.5%
are sensor glitches (``-999.0``) for range filters to catch. With ``dup_ratio`` > 0 a
reading is, with that probability, a retransmission: an exact copy (same ``id``,
same ``ts``) of the reading before it, for deduplication to remove.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["CITIES", "METRICS", "UrbanMaker"]

Record = dict[str, Any]
Timestamps = np.ndarray[Any, np.dtype[np.int64]]

CITIES = (
    "Bangalore",
    "Boston",
    "Geneva",
    "Rio de Janeiro",
    "San Francisco",
    "Shanghai",
    "Singapore",
)
METRICS = ("pollution", "dust", "light", "sound", "temperature", "humidity")
#: per-city baseline of each metric, in METRICS order
_BASE = np.array(
    [
        [95.0, 1500.0, 6000.0, 68.0, 27.0, 70.0],
        [35.0, 400.0, 4000.0, 62.0, 12.0, 62.0],
        [25.0, 300.0, 4500.0, 55.0, 10.0, 72.0],
        [60.0, 900.0, 8000.0, 70.0, 26.0, 78.0],
        [30.0, 350.0, 5000.0, 60.0, 15.0, 75.0],
        [110.0, 1800.0, 4000.0, 66.0, 17.0, 74.0],
        [45.0, 500.0, 7000.0, 64.0, 28.0, 84.0],
    ]
)
_SPREAD = np.array([20.0, 250.0, 2000.0, 8.0, 4.0, 8.0])
_GLITCH = 0.005


class UrbanMaker:
    def __init__(self, rng: np.random.Generator, *, sensors: int = 10, dup_ratio: float = 0.0):
        if sensors < 1 or not 0.0 <= dup_ratio < 1.0:
            msg = f"need sensors >= 1 and 0 <= dup_ratio < 1, got {sensors}, {dup_ratio}"
            raise TypeError(msg)
        self.sensors = sensors
        self.dup_ratio = dup_ratio
        slugs = [c.lower().replace(" ", "-") for c in CITIES]
        self.sensor_names = [f"{slug}-{j:02d}" for slug in slugs for j in range(sensors)]
        self.sensor_city = [c for c in CITIES for _ in range(sensors)]
        # object arrays: fancy indexing gives the str objects without a Python loop
        self.names_of = np.array(self.sensor_names, dtype=object)
        self.city_of = np.array(self.sensor_city, dtype=object)
        self.metric_names = np.array(METRICS, dtype=object)

    def chunk(self, rng: np.random.Generator, first: int, ts: Timestamps) -> list[Record]:
        n = len(ts)
        sensor = rng.integers(0, len(self.sensor_names), n)
        metric = rng.integers(0, len(METRICS), n)
        noise = rng.standard_normal(n)
        glitch = rng.random(n) < _GLITCH
        dup = rng.random(n) < self.dup_ratio
        city = sensor // self.sensors
        value = _BASE[city, metric] + _SPREAD[metric] * noise
        value = np.where(metric == METRICS.index("temperature"), value, np.maximum(value, 0.0))
        value = np.where(glitch, -999.0, np.round(value, 2))
        ids = np.arange(first, first + n, dtype=np.int64)
        ts_a = ts
        dup[0] = False
        if dup.any():  # a retransmission copies the latest original before it
            src = np.maximum.accumulate(np.where(dup, 0, np.arange(n)))
            sensor, metric, value, ids, ts_a = (
                sensor[src],
                metric[src],
                value[src],
                ids[src],
                ts_a[src],
            )
        return [
            {"ts": t, "city": c, "metric": m, "value": v, "sensor": s, "id": i}
            for t, c, m, v, s, i in zip(
                ts_a.tolist(),
                self.city_of[sensor].tolist(),
                self.metric_names[metric].tolist(),
                value.tolist(),
                self.names_of[sensor].tolist(),
                ids.tolist(),
                strict=True,
            )
        ]
