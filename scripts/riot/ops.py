"""RIoTBench-like operators for the STATS and PRED topologies (scripts/bench_scheduling.py).

Register it (``agiledart register scripts/riot/ops.py --via HOST:PORT``) and name the
functions ``"<code_id>:<function>"`` in ``stats.yaml`` / ``pred.yaml``. Every function is
a :func:`~agiledart.app.functions.factory`: its params are bound once per operator and it
returns the per-record function, which keeps its state (per key) in its closure.

The work imitates RIoTBench's tasks on the ``urban`` readings (``{ts, city, metric,
value, sensor, id}``): SenML parse, block average, a Kalman filter step, sliding
linear regression, approximate distinct count, decision-tree classification,
multi-variate linear regression, error estimate and a SenML publish. Each function does
that work for real (small work, a few microseconds in CPython) and then burns its
``cost_us`` param of CPU in a calibrated busy loop: the specs give two operators of
each topology a heavy ``cost_us`` and the others a light one, so operator costs are
skewed as in the EdgeWise paper's topologies.

The busy loop counts iterations calibrated against this thread's CPU clock (best of a
few short runs, once per process): a fixed amount of work per record, so an operator
preempted by the OS still costs the same CPU, whichever scheduler runs it.

Per-key state (averages, filters, sketches) lives in the closure, so in each process
that runs the operator: the engine treats ``map``/``flat_map`` as stateless and may run
one operator's records on several workers, each then keeping its own share of the
state. The figures stay per record; only the outputs of ``average`` (one per full
block) vary a little with the split.
"""

from __future__ import annotations

import functools
import json
import math
import time
import zlib
from collections import deque
from collections.abc import Callable
from typing import Any

from agiledart.app import factory

Record = dict[str, Any]
Fn = Callable[[Record], Any]

# -- calibrated CPU cost ----------------------------------------------------------------


def _spin(n: int) -> int:
    x = 0
    for i in range(n):
        x ^= i
    return x


@functools.cache
def loops_per_us() -> float:
    """Iterations of :func:`_spin` per microsecond of this thread's CPU time."""
    n, best = 20_000, 0.0
    for _ in range(7):
        t0 = time.thread_time()
        _spin(n)
        dt = time.thread_time() - t0
        if dt > 0:
            best = max(best, n / (dt * 1e6))
    return best or 10.0


def burner(cost_us: float) -> Callable[[], None]:
    """A function that burns ``cost_us`` microseconds of CPU per call (none for 0)."""
    n = round(float(cost_us) * loops_per_us())

    def burn() -> None:
        _spin(n)

    return burn if n > 0 else lambda: None


# -- SenML ------------------------------------------------------------------------------

_UNITS = {
    "pollution": "ppm",
    "dust": "pcs/l",
    "light": "lux",
    "sound": "dB",
    "temperature": "C",
    "humidity": "%",
}
_PLACES = {
    "Bangalore": (12.97, 77.59),
    "Boston": (42.36, -71.06),
    "Geneva": (46.2, 6.14),
    "Rio de Janeiro": (-22.91, -43.17),
    "San Francisco": (37.77, -122.42),
    "Shanghai": (31.23, 121.47),
    "Singapore": (1.35, 103.82),
}


def senml(r: Record) -> str:
    """The reading as the ~380-byte SenML message a RIoTBench source would carry."""
    lat, lon = _PLACES.get(r["city"], (0.0, 0.0))
    return json.dumps(
        {
            "bt": r["ts"],
            "bn": f"urn:dev:{r['sensor']}:",
            "e": [
                {"n": "source", "u": "string", "sv": f"{r['sensor']}-{r['id']:012d}"},
                {"n": "city", "u": "string", "sv": r["city"]},
                {"n": "latitude", "u": "lat", "v": str(lat)},
                {"n": "longitude", "u": "lon", "v": str(lon)},
                {"n": r["metric"], "u": _UNITS.get(r["metric"], "?"), "v": str(r["value"])},
                {"n": "battery", "u": "%", "v": "87.5"},
            ],
        }
    )


@factory
def parse(*, cost_us: float = 0.0) -> Fn:
    """SenML parse: the reading's wire message decoded into a flat record."""
    burn = burner(cost_us)

    def fn(r: Record) -> Record:
        doc = json.loads(senml(r))
        fields = {e["n"]: e.get("sv", e.get("v")) for e in doc["e"]}
        metric = r["metric"]
        burn()
        return {
            "ts": doc["bt"],
            "id": r["id"],
            "sensor": r["sensor"],
            "city": fields["city"],
            "metric": metric,
            "value": float(fields[metric]),
            "key": f"{fields['city']}/{metric}",
            "size": len(fields),
        }

    return fn


# -- STATS ------------------------------------------------------------------------------


def _valid(r: Record) -> bool:
    return bool(r["value"] > -900.0)  # the dataset's glitches read -999


@factory
def average(*, block: int = 10, cost_us: float = 0.0) -> Fn:
    """Block window average per key: one result per ``block`` valid readings."""
    burn = burner(cost_us)
    sums: dict[str, list[float]] = {}

    def fn(r: Record) -> list[Record]:
        burn()
        if not _valid(r):
            return []
        acc = sums.setdefault(r["key"], [0.0, 0.0])
        acc[0] += r["value"]
        acc[1] += 1
        if acc[1] < block:
            return []
        mean = acc[0] / acc[1]
        acc[0] = acc[1] = 0.0
        return [{"ts": r["ts"], "key": r["key"], "kind": "average", "value": round(mean, 3)}]

    return fn


@factory
def kalman(*, q: float = 0.125, r: float = 4.0, cost_us: float = 0.0) -> Fn:
    """One step of a scalar Kalman filter per (sensor, metric)."""
    burn = burner(cost_us)
    state: dict[tuple[str, str], list[float]] = {}

    def fn(rec: Record) -> Record:
        burn()
        key = (rec["sensor"], rec["metric"])
        x_p = state.get(key)
        z = rec["value"]
        if x_p is None:
            x_p = state[key] = [z, 1.0]
        elif _valid(rec):
            p = x_p[1] + q
            gain = p / (p + r)
            x_p[0] += gain * (z - x_p[0])
            x_p[1] = (1 - gain) * p
        return {"ts": rec["ts"], "key": rec["key"], "sensor": rec["sensor"], "value": x_p[0]}

    return fn


@factory
def regression(*, window: int = 10, horizons: int = 3, cost_us: float = 0.0) -> Fn:
    """Sliding linear regression over the last ``window`` filtered values per key;
    predictions ``1..horizons`` steps ahead."""
    burn = burner(cost_us)
    history: dict[str, deque[float]] = {}

    def fn(r: Record) -> list[Record]:
        ys = history.get(r["key"])
        if ys is None:
            ys = history[r["key"]] = deque(maxlen=window)
        ys.append(r["value"])
        n = len(ys)
        mean_x, mean_y = (n - 1) / 2, sum(ys) / n
        sxx = sum((i - mean_x) ** 2 for i in range(n)) or 1.0
        sxy = sum((i - mean_x) * (y - mean_y) for i, y in enumerate(ys))
        slope = sxy / sxx
        burn()
        return [
            {
                "ts": r["ts"],
                "key": r["key"],
                "kind": "forecast",
                "horizon": h,
                "value": round(mean_y + slope * (n - 1 + h - mean_x), 3),
            }
            for h in range(1, horizons + 1)
        ]

    return fn


@factory
def distinct(*, registers: int = 64, cost_us: float = 0.0) -> Fn:
    """Approximate count of distinct sensors per city (a small HyperLogLog)."""
    burn = burner(cost_us)
    bits = registers.bit_length() - 1
    alpha = 0.709 * registers
    sketches: dict[str, list[int]] = {}

    def fn(r: Record) -> Record:
        burn()
        regs = sketches.setdefault(r["city"], [0] * registers)
        h = zlib.crc32(r["sensor"].encode())
        j, rest = h & (registers - 1), h >> bits
        rank = (32 - bits) - rest.bit_length() + 1
        regs[j] = max(regs[j], rank)
        estimate = alpha * registers / sum(2.0**-x for x in regs)
        zeros = regs.count(0)
        if estimate <= 2.5 * registers and zeros:
            estimate = registers * math.log(registers / zeros)
        return {"ts": r["ts"], "key": r["city"], "kind": "distinct", "value": round(estimate)}

    return fn


# -- PRED -------------------------------------------------------------------------------

#: per metric: (low, high) thresholds of the decision tree
_BANDS = {
    "pollution": (40.0, 90.0),
    "dust": (400.0, 1200.0),
    "light": (3000.0, 7000.0),
    "sound": (58.0, 68.0),
    "temperature": (12.0, 26.0),
    "humidity": (65.0, 80.0),
}
_METRIC_INDEX = {m: i for i, m in enumerate(_BANDS)}
_CITY_INDEX = {c: i for i, c in enumerate(_PLACES)}


@factory
def classify(*, cost_us: float = 0.0) -> Fn:
    """Decision-tree classification of a reading (RIoTBench DecisionTreeClassify)."""
    burn = burner(cost_us)

    def fn(r: Record) -> Record:
        burn()
        low, high = _BANDS.get(r["metric"], (0.0, 1.0))
        v = r["value"]
        hour = (r["ts"] // 3_600_000) % 24
        if not _valid(r):
            label = "invalid"
        elif v < low:
            label = "low" if 6 <= hour < 20 else "low-night"
        elif v > high:
            label = "high" if r["city"] in ("Shanghai", "Bangalore") else "alert"
        else:
            label = "normal"
        return {"ts": r["ts"], "key": r["key"], "kind": "class", "value": label}

    return fn


@factory
def predict(*, cost_us: float = 0.0) -> Fn:
    """Multi-variate linear regression prediction (RIoTBench MultiVarLinearReg)."""
    burn = burner(cost_us)
    weights = (0.92, 0.35, -0.8, 1.7, 0.05)

    def fn(r: Record) -> Record:
        burn()
        x = (
            r["value"],
            float((r["ts"] // 3_600_000) % 24),
            float(_CITY_INDEX.get(r["city"], 0)),
            float(_METRIC_INDEX.get(r["metric"], 0)),
            1.0,
        )
        value = sum(w * xi for w, xi in zip(weights, x, strict=True))
        return {"ts": r["ts"], "key": r["key"], "kind": "prediction", "value": round(value, 3)}

    return fn


@factory
def error_estimate(*, cost_us: float = 0.0) -> Fn:
    """Error of the predictions against the latest block average of their key."""
    burn = burner(cost_us)
    latest: dict[str, float] = {}

    def fn(r: Record) -> Record:
        burn()
        if r["kind"] == "average":
            latest[r["key"]] = r["value"]
            return r
        ref = latest.get(r["key"])
        err = None if ref is None else round(abs(r["value"] - ref) / (abs(ref) or 1.0), 4)
        return {"ts": r["ts"], "key": r["key"], "kind": "error", "value": err}

    return fn


@factory
def publish(*, cost_us: float = 0.0) -> Fn:
    """SenML-encode a result for an MQTT topic (the publish step of RIoTBench)."""
    burn = burner(cost_us)

    def fn(r: Record) -> Record:
        payload = json.dumps(
            {"bt": r["ts"], "bn": f"urn:riot:{r['key']}:", "e": [{"n": r["kind"], "v": r["value"]}]}
        )
        burn()
        return {"ts": r["ts"], "topic": f"riot/{r['kind']}/{r['key']}", "payload": payload}

    return fn
