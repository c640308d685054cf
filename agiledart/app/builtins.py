"""The ``builtin:`` function library used by the bundled apps.

Each entry is a factory (see :mod:`agiledart.app.functions`): called once with the
operator's ``params`` as keyword arguments, it returns the per-record function. The
``kind`` says which operator it is written for; validation rejects, say, a flat_map
function used in a filter, and parameters the factory does not take.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agiledart.app.functions import factory

__all__ = ["BUILTINS", "UNITS", "VALID_RANGES", "Builtin"]

Record = dict[str, Any]

#: Units of the urban-sensing metrics.
UNITS: Mapping[str, str] = {
    "pollution": "AQI",
    "dust": "pcs/238mL",
    "light": "lux",
    "sound": "dB",
    "temperature": "C",
    "humidity": "%",
}
#: Plausible value ranges per metric (RIoTBench's range filter).
VALID_RANGES: Mapping[str, tuple[float, float]] = {
    "pollution": (0.0, 500.0),
    "dust": (0.0, 5000.0),
    "light": (0.0, 100000.0),
    "sound": (0.0, 140.0),
    "temperature": (-40.0, 60.0),
    "humidity": (0.0, 100.0),
}


@dataclass(frozen=True, slots=True)
class Builtin:
    name: str
    kind: str  # map | filter | flat_map | key_by
    factory: Callable[..., Callable[[Record], Any]]

    @property
    def parameters(self) -> tuple[str, ...]:
        return tuple(inspect.signature(self.factory).parameters)

    @property
    def doc(self) -> str:
        return (self.factory.__doc__ or "").strip().splitlines()[0]


BUILTINS: dict[str, Builtin] = {}


def _builtin(kind: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        BUILTINS[fn.__name__] = Builtin(fn.__name__, kind, factory(fn))
        return fn

    return register


# --- generic -------------------------------------------------------------------------


@_builtin("map")
def identity() -> Callable[[Record], Record]:
    """The record unchanged."""
    return lambda r: r


@_builtin("map")
def project(*, fields: list[str]) -> Callable[[Record], Record]:
    """Only ``fields`` (and ``ts``) of the record."""
    keep = tuple(dict.fromkeys(["ts", *fields]))
    return lambda r: {f: r[f] for f in keep if f in r}


@_builtin("map")
def scale(
    *, field: str = "value", factor: float = 1.0, offset: float = 0.0
) -> Callable[[Record], Record]:
    """``field`` replaced by ``field * factor + offset``."""

    def f(r: Record) -> Record:
        out = r.copy()  # faster than {**r, ...}; never mutate the input
        out[field] = r[field] * factor + offset
        return out

    return f


@_builtin("filter")
def above(*, field: str = "value", threshold: float = 0.0) -> Callable[[Record], bool]:
    """Records whose ``field`` is greater than ``threshold``."""
    return lambda r: r[field] > threshold


@_builtin("filter")
def skip_every(*, field: str = "seq", n: int = 10) -> Callable[[Record], bool]:
    """Records whose integer ``field`` is not a multiple of ``n`` (drops 1 in ``n``)."""
    return lambda r: r[field] % n != 0


@_builtin("filter")
def equals(*, field: str, value: Any) -> Callable[[Record], bool]:
    """Records whose ``field`` equals ``value``."""
    return lambda r: r.get(field) == value


# --- urban sensing -------------------------------------------------------------------


@_builtin("filter")
def is_hot(
    *, threshold: float = 30.0, metric: str | None = "temperature"
) -> Callable[[Record], bool]:
    """Readings of ``metric`` (any metric if null) with a value above ``threshold``."""
    if metric is None:
        return lambda r: r["value"] > threshold
    return lambda r: r["metric"] == metric and r["value"] > threshold


@_builtin("filter")
def in_range(*, ranges: Mapping[str, list[float]] | None = None) -> Callable[[Record], bool]:
    """Readings whose value lies in the plausible range of its metric (range filter)."""
    table = {m: (float(lo), float(hi)) for m, (lo, hi) in (ranges or VALID_RANGES).items()}

    def f(r: Record) -> bool:
        lo_hi = table.get(r["metric"])
        return lo_hi is not None and lo_hi[0] <= r["value"] <= lo_hi[1]

    return f


@_builtin("map")
def annotate() -> Callable[[Record], Record]:
    """The reading with its metric's ``unit`` added."""
    units = dict(UNITS)
    return lambda r: dict(r, unit=units.get(r["metric"], ""))


@_builtin("map")
def to_fahrenheit() -> Callable[[Record], Record]:
    """Temperature readings converted to Fahrenheit (other metrics unchanged)."""

    def f(r: Record) -> Record:
        if r["metric"] != "temperature":
            return r
        return dict(r, value=round(r["value"] * 9 / 5 + 32, 2), unit="F")

    return f


# --- DEBS 2015 taxi trips ------------------------------------------------------------


@_builtin("filter")
def valid_trip() -> Callable[[Record], bool]:
    """Trips with a positive distance and fare and both cells on the grid."""
    return lambda r: (
        r["distance"] > 0
        and r["fare"] > 0
        and r["pickup_cell"] != "0.0"
        and r["dropoff_cell"] != "0.0"
    )


@_builtin("map")
def route() -> Callable[[Record], Record]:
    """``{ts, route: "<pickup cell>-><dropoff cell>", medallion}`` (query 1)."""
    return lambda r: {
        "ts": r["ts"],
        "route": f"{r['pickup_cell']}->{r['dropoff_cell']}",
        "medallion": r["medallion"],
    }


@_builtin("map")
def profit() -> Callable[[Record], Record]:
    """``{ts, cell: pickup cell, profit: fare + tip}`` (query 2)."""
    return lambda r: {"ts": r["ts"], "cell": r["pickup_cell"], "profit": r["fare"] + r["tip"]}


@_builtin("map")
def dropoff() -> Callable[[Record], Record]:
    """``{ts, cell: dropoff cell, medallion}``: a taxi that became empty (query 2)."""
    return lambda r: {"ts": r["ts"], "cell": r["dropoff_cell"], "medallion": r["medallion"]}


@_builtin("map")
def profitability() -> Callable[[Record], Record]:
    """A join of (mean profit, empty taxis) per cell -> ``profit / empty_taxis``."""

    def f(r: Record) -> Record:
        p, n = r["left"]["value"], r["right"]["value"]
        return {
            "ts": r["ts"],
            "cell": r["key"],
            "profit": p,
            "empty_taxis": n,
            "profitability": p / n if n else 0.0,
        }

    return f


# --- words ---------------------------------------------------------------------------

_WORD = re.compile(r"[A-Za-z0-9']+")


@_builtin("flat_map")
def split_words(*, field: str = "line", lower: bool = True) -> Callable[[Record], list[Record]]:
    """One ``{ts, word}`` record per word of ``field``."""
    find = _WORD.findall

    def f(r: Record) -> list[Record]:
        text: str = r[field]
        ts = r["ts"]
        return [{"ts": ts, "word": w} for w in find(text.lower() if lower else text)]

    return f
