"""The data plane's wire frames between operator instances (docs/architecture.md).

Four one-way frames travel on the peers' frame connections, each a msgpack map with
short keys (the keys and their order are the wire format; ``to_wire`` writes them
exactly so):

=========  ==========================================================  =============
type       map                                                         value
=========  ==========================================================  =============
``data``   ``{"a": app, "p": producer, "b": batch, "g": generation}``  DataFrame
``wm``     ``{"a": app, "p": producer, "w": watermark, "c": wall ms,   WatermarkFrame
           "g": generation}``
``bar``    ``{"a": app, "p": producer, "e": epoch, "g": generation}``  BarrierFrame
``credit`` ``{"a": app, "e": edge, "n": credits, "g": generation[,     CreditFrame
           "gone": true]}``
=========  ==========================================================  =============

``b`` is a :class:`~agiledart.dataplane.batch.Batch` map (``e``, ``s``, ``r``[, ``t``]).
``g`` may be left out (generation 0). A watermark's ``c`` (the source's wall clock) is
informational: left out or not a number, it reads as 0.

Decoding is strict: whatever does not fit raises :class:`FrameError` (a batch that does
not fit, its subclass :class:`BatchDecodeError`), never another exception type. The
receiving driver counts it and drops the frame; the peer lives on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from agiledart.dataplane.batch import Batch
from agiledart.dataplane.errors import FrameError

__all__ = [
    "BarrierFrame",
    "CreditFrame",
    "DataFrame",
    "WatermarkFrame",
    "check_records",
]


def _map(raw: object, kind: str) -> dict[Any, Any]:
    if not isinstance(raw, dict):
        msg = f"{kind} frame must be a map, got {type(raw).__name__}"
        raise FrameError(msg)
    return raw


def _name(raw: dict[Any, Any], key: str, kind: str, what: str) -> str:
    value = raw.get(key)
    if type(value) is not str or not value:
        msg = f"{kind} frame needs {what} {key!r} as a non-empty string, got {value!r}"
        raise FrameError(msg)
    return value


def _int(raw: dict[Any, Any], key: str, kind: str, what: str) -> int:
    value = raw.get(key)
    if type(value) is not int:
        msg = f"{kind} frame needs {what} {key!r} as an integer, got {value!r}"
        raise FrameError(msg)
    return value


def _generation(raw: dict[Any, Any], kind: str) -> int:
    g = raw.get("g", 0)
    if type(g) is not int or g < 0:
        msg = f"{kind} frame generation 'g' must be an integer >= 0, got {g!r}"
        raise FrameError(msg)
    return g


@dataclass(frozen=True, slots=True)
class DataFrame:
    """A batch of ``producer``'s records for the peer's instance of ``app_id``."""

    TYPE: ClassVar[str] = "data"

    app_id: str
    producer: str
    batch: Batch
    generation: int = 0

    def to_wire(self) -> dict[str, Any]:
        return {
            "a": self.app_id,
            "p": self.producer,
            "b": self.batch.to_dict(),
            "g": self.generation,
        }

    @classmethod
    def from_wire(cls, raw: object) -> DataFrame:
        d = _map(raw, "data")
        app_id = _name(d, "a", "data", "the app id")
        producer = _name(d, "p", "data", "the producer")
        generation = _generation(d, "data")
        return cls(app_id, producer, Batch.from_dict(d.get("b")), generation)


def check_records(batch: Batch) -> None:
    """Records reach operators as maps: a batch of anything else is malformed.

    Separate from :meth:`DataFrame.from_wire` because it reads every record: the driver
    checks it only for frames of an app that runs here."""
    records = batch.records
    if records and set(map(type, records)) != {dict}:
        msg = f"batch {batch.edge}#{batch.seq}: records must be maps"
        raise FrameError(msg)


@dataclass(frozen=True, slots=True)
class WatermarkFrame:
    """``producer``'s event-time watermark, after all of its data sent before."""

    TYPE: ClassVar[str] = "wm"

    app_id: str
    producer: str
    watermark: int
    wall: float = 0.0  #: the source's wall clock (ms) when it was cut
    generation: int = 0

    def to_wire(self) -> dict[str, Any]:
        return {
            "a": self.app_id,
            "p": self.producer,
            "w": self.watermark,
            "c": self.wall,
            "g": self.generation,
        }

    @classmethod
    def from_wire(cls, raw: object) -> WatermarkFrame:
        d = _map(raw, "wm")
        app_id = _name(d, "a", "wm", "the app id")
        producer = _name(d, "p", "wm", "the producer")
        wm = _int(d, "w", "wm", "the watermark")
        wall = d.get("c")
        clock = float(wall) if isinstance(wall, int | float) and math.isfinite(wall) else 0.0
        return cls(app_id, producer, wm, clock, _generation(d, "wm"))


@dataclass(frozen=True, slots=True)
class BarrierFrame:
    """Checkpoint barrier ``epoch`` of ``producer``, after all of its data sent before."""

    TYPE: ClassVar[str] = "bar"

    app_id: str
    producer: str
    epoch: int
    generation: int = 0

    def to_wire(self) -> dict[str, Any]:
        return {"a": self.app_id, "p": self.producer, "e": self.epoch, "g": self.generation}

    @classmethod
    def from_wire(cls, raw: object) -> BarrierFrame:
        d = _map(raw, "bar")
        app_id = _name(d, "a", "bar", "the app id")
        producer = _name(d, "p", "bar", "the producer")
        epoch = _int(d, "e", "bar", "the epoch")
        return cls(app_id, producer, epoch, _generation(d, "bar"))


@dataclass(frozen=True, slots=True)
class CreditFrame:
    """``credits`` more batches the receiver takes on ``edge``; ``gone``: the receiver
    does not run the app (no credit will ever come)."""

    TYPE: ClassVar[str] = "credit"

    app_id: str
    edge: str
    credits: int
    generation: int = 0
    gone: bool = False

    def to_wire(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "a": self.app_id,
            "e": self.edge,
            "n": self.credits,
            "g": self.generation,
        }
        if self.gone:
            d["gone"] = True
        return d

    @classmethod
    def from_wire(cls, raw: object) -> CreditFrame:
        d = _map(raw, "credit")
        app_id = _name(d, "a", "credit", "the app id")
        edge = _name(d, "e", "credit", "the edge")
        n = _int(d, "n", "credit", "the credit count")
        gone = d.get("gone", False)
        if type(gone) is not bool:
            msg = f"credit frame 'gone' must be a boolean, got {gone!r}"
            raise FrameError(msg)
        if n < (0 if gone else 1):
            msg = f"credit frame grants {n} credits"
            raise FrameError(msg)
        return cls(app_id, edge, n, _generation(d, "credit"), gone)
