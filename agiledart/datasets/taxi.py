"""``taxi``: DEBS 2015 Grand Challenge-style taxi trips on a grid of cells.

A trip is reported when it ends (``ts`` is the drop-off time, as in the challenge):
``{"ts", "medallion", "hack_license", "pickup_ts", "dropoff_ts", "trip_time_s",
"distance", "pickup_cell", "dropoff_cell", "payment", "fare", "surcharge", "mta_tax",
"tip", "tolls", "total"}``. Cells are ``"x.y"`` on a ``cells`` x ``cells`` grid
(1-based, like the challenge's 500 m cells); pickups and drop-offs cluster around a few
hotspots so some routes are frequent. ``taxis`` medallions (32 hex digits) each have
one driver licence. About ``invalid_ratio`` of the trips carry the data errors of the
real feed (zero distance, or a cell ``"0.0"`` for a missing GPS fix).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["TaxiMaker"]

Record = dict[str, Any]
Timestamps = np.ndarray[Any, np.dtype[np.int64]]
_HOTSPOTS = 8
_HOTSPOT_SD = 1.5  # cells


class TaxiMaker:
    def __init__(
        self,
        rng: np.random.Generator,
        *,
        cells: int = 300,
        taxis: int = 1000,
        invalid_ratio: float = 0.01,
    ) -> None:
        if cells < 1 or taxis < 1 or not 0.0 <= invalid_ratio < 1.0:
            msg = f"need cells >= 1, taxis >= 1, 0 <= invalid_ratio < 1; got {cells}, {taxis}"
            raise TypeError(msg)
        self.cells, self.invalid_ratio = cells, invalid_ratio
        raw = rng.bytes(32 * taxis)
        self.medallions = [raw[16 * i : 16 * i + 16].hex().upper() for i in range(taxis)]
        self.licenses = [
            raw[16 * (taxis + i) : 16 * (taxis + i) + 16].hex().upper() for i in range(taxis)
        ]
        lo, hi = max(1, cells // 4), max(1, 3 * cells // 4)
        self.hotspots = rng.integers(lo, hi + 1, size=(_HOTSPOTS, 2))
        w = 1.0 / np.arange(1, _HOTSPOTS + 1)
        self.hot_p = w / w.sum()

    def _cells(self, rng: np.random.Generator, n: int) -> np.ndarray[Any, Any]:
        spot = rng.choice(_HOTSPOTS, size=n, p=self.hot_p)
        xy = self.hotspots[spot] + rng.normal(0.0, _HOTSPOT_SD, size=(n, 2))
        return np.clip(np.rint(xy), 1, self.cells).astype(np.int64)

    def chunk(self, rng: np.random.Generator, first: int, ts: Timestamps) -> list[Record]:
        n = len(ts)
        taxi = rng.integers(0, len(self.medallions), n)
        pick, drop = self._cells(rng, n), self._cells(rng, n)
        trip_s = np.clip(rng.gamma(2.0, 360.0, n), 60, 3600).astype(np.int64)
        speed = rng.uniform(6.0, 20.0, n)  # mph
        distance = np.round(trip_s / 3600.0 * speed, 2)
        fare = np.round(2.5 + 2.5 * distance + 0.5 * trip_s / 60.0, 1)
        card = rng.random(n) < 0.6
        tip = np.where(card, np.round(fare * rng.uniform(0.1, 0.25, n), 2), 0.0)
        tolls = np.where(rng.random(n) < 0.05, 5.33, 0.0)
        bad = rng.random(n) < self.invalid_ratio
        bad_kind = rng.integers(0, 2, n)
        distance = np.where(bad & (bad_kind == 0), 0.0, distance)
        nocell = bad & (bad_kind == 1)
        total = np.round(fare + 0.5 + 0.5 + tip + tolls, 2)
        pickup_ts = (ts - trip_s * 1000).tolist()
        pc = [f"{x}.{y}" for x, y in pick.tolist()]
        dc = [f"{x}.{y}" for x, y in drop.tolist()]
        for i in np.flatnonzero(nocell).tolist():
            pc[i] = "0.0"
        med, lic = self.medallions, self.licenses
        return [
            {
                "ts": t,
                "medallion": med[m],
                "hack_license": lic[m],
                "pickup_ts": pt,
                "dropoff_ts": t,
                "trip_time_s": tt,
                "distance": d,
                "pickup_cell": p,
                "dropoff_cell": q,
                "payment": "CRD" if c else "CSH",
                "fare": f,
                "surcharge": 0.5,
                "mta_tax": 0.5,
                "tip": tp,
                "tolls": tl,
                "total": tot,
            }
            for t, m, pt, tt, d, p, q, c, f, tp, tl, tot in zip(
                ts.tolist(),
                taxi.tolist(),
                pickup_ts,
                trip_s.tolist(),
                distance.tolist(),
                pc,
                dc,
                card.tolist(),
                fare.tolist(),
                tip.tolist(),
                tolls.tolist(),
                total.tolist(),
                strict=True,
            )
        ]
