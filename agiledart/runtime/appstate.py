"""An app as its scheduler holds it: the lifecycle as a table, the stored record, and
one :class:`ScheduledApp` per app holding everything the scheduler keeps about it.

The lifecycle (``AppRecord.state``)::

    deploying ──> running ──> finished | failed | stopped
        │            └──> running   (a new generation: recovered or rescaled)
        └──> finished | failed | stopped

The three ended states are final: :meth:`AppRecord.move_to` raises
:class:`IllegalTransition` for any move the table does not allow. Records store the
state as its plain name, as they always have, so records written before the table
existed load unchanged.
"""

from __future__ import annotations

import asyncio
import datetime
import enum
from dataclasses import dataclass, field
from typing import Any

from agiledart.app.errors import AppError
from agiledart.app.spec import AppSpec
from agiledart.runtime.epochs import Epochs
from agiledart.runtime.errors import UnknownApp
from agiledart.runtime.links import Address
from agiledart.runtime.records import record_key

__all__ = [
    "LIVE_STATES",
    "TRANSITIONS",
    "AppRecord",
    "AppState",
    "IllegalTransition",
    "ScheduledApp",
    "apps_index",
    "utc_day",
]


class AppState(enum.StrEnum):
    DEPLOYING = "deploying"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    STOPPED = "stopped"

    @property
    def live(self) -> bool:
        return self in LIVE_STATES


_ENDS = frozenset({AppState.FINISHED, AppState.FAILED, AppState.STOPPED})

#: state -> the states it may move to; an ended app moves nowhere
TRANSITIONS: dict[AppState, frozenset[AppState]] = {
    AppState.DEPLOYING: frozenset({AppState.RUNNING}) | _ENDS,
    AppState.RUNNING: frozenset({AppState.RUNNING}) | _ENDS,
    AppState.FINISHED: frozenset(),
    AppState.FAILED: frozenset(),
    AppState.STOPPED: frozenset(),
}

LIVE_STATES = (AppState.DEPLOYING, AppState.RUNNING)


class IllegalTransition(AppError):
    """A move of an app's state that :data:`TRANSITIONS` does not allow (local misuse:
    an ended app is never revived)."""

    def __init__(self, app_id: str, old: AppState, new: AppState) -> None:
        super().__init__(f"app {app_id}: no transition from {old} to {new}")
        self.app_id, self.old, self.new = app_id, old, new


#: days of the apps index ``apps`` reads by default, and apps it lists at most
APPS_DAYS, APPS_LIMIT = 7, 500


def apps_index(day: datetime.date) -> int:
    """The key of the apps submitted on ``day`` (UTC): one set per day, so that no
    index grows without bound and ``apps`` reads only the days it is asked for."""
    return record_key("index", f"apps:{day.isoformat()}")


def utc_day(t: float) -> datetime.date:
    return datetime.datetime.fromtimestamp(t, tz=datetime.UTC).date()


#: the type of each field of an app record that comes from the store or a peer
_RECORD_TYPES: dict[str, type | tuple[type, ...]] = {
    "app_id": str,
    "name": str,
    "spec": dict,
    "state": str,
    "scheduler": (list, tuple),
    "scheduler_name": str,
    "submitted_at": (int, float),
    "placement": dict,
    "sources": dict,
    "sinks": dict,
    "paths": list,
    "addresses": dict,
    "error": (str, type(None)),
    "final": (dict, type(None)),
    "finished_at": (int, float, type(None)),
    "generation": int,
    "recoveries": list,
    "checkpoint": (dict, type(None)),
    "checkpoints": int,
    "checkpoint_failures": int,
    "checkpoint_error": (dict, type(None)),
    "rescales": list,
    "strategy": str,
}


@dataclass
class AppRecord:
    """What the records store keeps about an app."""

    app_id: str
    name: str
    spec: dict[str, Any]
    state: AppState
    scheduler: Address
    scheduler_name: str
    submitted_at: float
    placement: dict[str, list[str]] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    sinks: dict[str, str] = field(default_factory=dict)
    paths: list[list[str]] = field(default_factory=list)
    addresses: dict[str, list[Any]] = field(default_factory=dict)
    error: str | None = None
    final: dict[str, Any] | None = None
    finished_at: float | None = None
    generation: int = 0  #: incremented by every recovery
    recoveries: list[dict[str, Any]] = field(default_factory=list)
    checkpoint: dict[str, Any] | None = None  #: the last committed epoch (see epochs.py)
    checkpoints: int = 0  #: epochs committed
    checkpoint_failures: int = 0  #: epochs abandoned because a state was not stored
    #: why the last epoch was abandoned, until a later one commits: epoch, instance,
    #: error, at
    checkpoint_error: dict[str, Any] | None = None
    #: scale-outs and migrations carried out (agiledart.runtime.scaling)
    rescales: list[dict[str, Any]] = field(default_factory=list)
    strategy: str = "join-routing"  #: the placement strategy used (spec ``placement``)

    def __post_init__(self) -> None:
        try:
            self.state = AppState(self.state)
        except ValueError as exc:
            msg = f"app record has no state {self.state!r}"
            raise UnknownApp(msg) from exc

    @property
    def live(self) -> bool:
        return self.state in LIVE_STATES

    def move_to(self, state: AppState) -> None:
        """Change the state as :data:`TRANSITIONS` allows; IllegalTransition otherwise."""
        if state not in TRANSITIONS[self.state]:
            raise IllegalTransition(self.app_id, self.state, state)
        self.state = state

    def to_wire(self) -> dict[str, Any]:
        d = dict(vars(self))
        d["scheduler"] = list(self.scheduler)
        d["state"] = str(self.state.value)
        return d

    @classmethod
    def from_wire(cls, raw: Any) -> AppRecord:
        """A record read from the store or sent by a peer; UnknownApp when malformed."""
        if not isinstance(raw, dict):
            msg = "app record is not a map"
            raise UnknownApp(msg)
        d = {k: v for k, v in raw.items() if k in cls.__dataclass_fields__}
        try:
            wrong = sorted(
                k for k, t in _RECORD_TYPES.items() if k in d and not isinstance(d[k], t)
            )
            if wrong:
                msg = f"wrong type of {', '.join(wrong)}"
                raise TypeError(msg)
            host, port = d["scheduler"]
            d["scheduler"] = (str(host), int(port))
            if d.get("checkpoint") is not None:
                check_commit(d["checkpoint"])
            d["addresses"] = {
                str(p): [str(a[0]), int(a[1])] for p, a in d.get("addresses", {}).items()
            }
            return cls(**d)
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            msg = f"app record is malformed: {type(exc).__name__}: {exc}"
            raise UnknownApp(msg) from exc

    def hosts(self) -> set[str]:
        peers = {p for ps in self.placement.values() for p in ps}
        return peers | set(self.sources.values()) | set(self.sinks.values())

    def address_of(self, peer: str) -> Address:
        a = self.addresses[peer]
        return (str(a[0]), int(a[1]))

    def known_addresses(self) -> dict[str, Address]:
        return {p: (str(a[0]), int(a[1])) for p, a in self.addresses.items()}


def check_commit(cp: dict[str, Any]) -> None:
    """TypeError unless ``cp`` has the shape of a committed epoch (what recovery reads
    from it: :func:`~agiledart.runtime.epochs.restore_plan`,
    :func:`~agiledart.runtime.recovery.holders_of`)."""
    if type(cp.get("epoch")) is not int:
        msg = "checkpoint needs an integer 'epoch'"
        raise TypeError(msg)
    if not isinstance(cp.get("sources"), dict) or not isinstance(cp.get("sinks"), dict):
        msg = "checkpoint needs 'sources' and 'sinks' maps"
        raise TypeError(msg)
    states = cp.get("states")
    if not isinstance(states, list):
        msg = "checkpoint needs a 'states' list"
        raise TypeError(msg)
    for entry in states:
        if not (
            isinstance(entry, dict)
            and isinstance(entry.get("peer"), str)
            and isinstance(entry.get("ops"), list)
            and isinstance(entry.get("holders"), list)
            and all(
                isinstance(h, list | tuple)
                and len(h) == 2
                and isinstance(h[1], list | tuple)
                and len(h[1]) == 2
                and isinstance(h[1][0], str)
                and type(h[1][1]) is int
                for h in entry["holders"]
            )
        ):
            msg = f"malformed checkpoint state {entry!r:.200}"
            raise TypeError(msg)


class ScheduledApp:
    """Everything a scheduler holds about one app it schedules: its record, the sinks
    that reported their end, its checkpoint epochs, its parsed spec, the lock its
    recoveries and rescales take turns on, its checkpoint loop and its end in progress.
    Forgetting the app is dropping this object."""

    __slots__ = (
        "adopted_from",
        "checkpoint_loop",
        "ending",
        "epochs",
        "lock",
        "parsed",
        "record",
        "sinks_done",
    )

    def __init__(self, record: AppRecord) -> None:
        self.record = record
        self.sinks_done: dict[str, dict[str, Any]] = {}  #: sink id -> its final report
        self.epochs = Epochs()
        #: the record's spec and its parse, while the app lives (see Scheduler.spec_of)
        self.parsed: tuple[dict[str, Any], AppSpec] | None = None
        self.lock = asyncio.Lock()  #: held by a recovery, an adoption or a rescale
        self.checkpoint_loop: asyncio.Task[None] | None = None
        #: set while the app's end is being recorded (its final statistics gathered)
        self.ending: asyncio.Event | None = None
        #: the scheduler this peer adopted the app from (its record names that one
        #: until this peer stores its own)
        self.adopted_from: str | None = None

    @property
    def app_id(self) -> str:
        return self.record.app_id
