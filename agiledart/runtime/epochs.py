"""Aligned checkpoint barriers (paper §IV-D; docs/recovery.md).

The app's scheduler cuts the stream into *epochs*: every ``interval_ms`` it asks each
source peer to inject barrier E into its sources' output, in order with the records
(the source notes how many records it had emitted: where a replay starts). A barrier
travels like a watermark. An operator instance, or a sink, reads its input *channels*
(one per upstream node and peer hosting it); once barrier E has come on one channel,
what follows on that channel is held back until E has come on every channel still
open (alignment, as in Flink's aligned checkpoints). At that moment every record
before the cut has been processed and none after it: a stateful instance snapshots its
operators, forwards E downstream and goes on; the snapshot is erasure-coded and stored
on leaf-set peers in the background (:mod:`agiledart.runtime.recovery`). A sink
commits what it wrote before E (a file sink: flushed, fsynced, its size noted). Each
reports to the scheduler, which commits E once the sources, every stateful instance
and every sink have reported; after a failure the app rolls back to the last committed
epoch as a whole: states restored, sources replayed from their offsets, file sinks
truncated to their committed size, so the output is exactly that of a run without the
failure.

A channel that delivered its final watermark is *finished*: alignment no longer waits
for it (a source that ended sends no more barriers).

On the scheduler's side, :class:`Epochs` is one app's epochs as values: which epoch is
being cut and what has reported its end so far (:class:`Epoch`), the number of the
next one, when the cut is complete, the commit it becomes, and the holders of older
epochs' fragments that may be dropped once that commit is stored. It does no I/O and
reads no clock (times are passed in); :mod:`agiledart.runtime.checkpointing` drives it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agiledart.app.spec import AppSpec
    from agiledart.runtime.links import Address

__all__ = [
    "CHECKPOINT_RATE",
    "Alignment",
    "Channel",
    "Epoch",
    "Epochs",
    "Pacer",
    "checkpointing",
    "restore_plan",
]

#: epochs one scheduler starts per second, at most, over all the apps it checkpoints
#: (see :class:`Pacer`)
CHECKPOINT_RATE = 2.0

Channel = tuple[str, str]  #: (producer node id, name of the peer its instance runs on)


class Alignment:
    """Which input channels have delivered the barrier of the epoch being aligned."""

    __slots__ = ("arrived", "channels", "epoch", "finished")

    def __init__(self, channels: Iterable[Channel]) -> None:
        self.channels = set(channels)
        self.finished: set[Channel] = set()
        self.epoch: int | None = None  #: the epoch being aligned (None: none)
        self.arrived: set[Channel] = set()

    def blocked(self, channel: Channel) -> bool:
        """Whether what comes on ``channel`` now must wait (its barrier came first)."""
        return channel in self.arrived

    def barrier(self, channel: Channel, epoch: int) -> int | None:
        """Barrier ``epoch`` came on ``channel``; the epoch if that completes it."""
        self.channels.add(channel)
        if self.epoch is None or epoch > self.epoch:
            self.epoch, self.arrived = epoch, set()
        elif epoch < self.epoch:
            return None  # an older epoch's barrier: its channel was not awaited
        self.arrived.add(channel)
        return self._complete()

    def finish(self, channel: Channel) -> int | None:
        """``channel`` ended; the epoch being aligned if it no longer waits for more."""
        self.finished.add(channel)
        return self._complete()

    def _complete(self) -> int | None:
        if self.epoch is None or not (self.channels - self.finished) <= self.arrived:
            return None
        epoch, self.epoch, self.arrived = self.epoch, None, set()
        return epoch


class Pacer:
    """A scheduler's checkpoint budget: epochs start at most ``rate`` a second over all
    the apps it schedules, first come, first served.

    Every checkpoint costs about 15 requests among the peers (barriers, m + k fragments
    stored and as many old ones dropped, reports, the app record rewritten), whatever
    the state's size. Below ``rate * interval`` checkpointed apps nobody waits; above,
    each app's interval stretches to about ``apps / rate`` seconds, because an app asks
    for its next slot only after its interval and holds at most one: the queue is never
    longer than the apps, and the peers' cost of checkpoints stays bounded however many
    small stateful queries they run (instead of the requests timing out).
    """

    __slots__ = ("gap", "next_free")

    def __init__(self, rate: float = CHECKPOINT_RATE) -> None:
        if not 0 < rate < float("inf"):  # also NaN
            msg = f"the checkpoint rate must be a positive number, got {rate}"
            raise ValueError(msg)
        self.gap = 1.0 / rate  #: seconds between two epochs started
        self.next_free = float("-inf")  #: the time of the next free slot

    def reserve(self, now: float) -> float:
        """Take the next free slot at or after ``now``; the seconds to wait for it."""
        slot = max(now, self.next_free)
        self.next_free = slot + self.gap
        return slot - now


@dataclass
class Epoch:
    """An epoch being cut: what has reported its end so far."""

    epoch: int
    started: float  #: monotonic seconds when its barriers were sent
    generation: int
    waited: float = 0.0  #: seconds it waited for the scheduler's checkpoint budget
    sources: dict[str, dict[str, Any]] = field(default_factory=dict)
    sinks: dict[str, dict[str, Any]] = field(default_factory=dict)
    states: dict[str, dict[str, Any]] = field(default_factory=dict)

    def note(self, report: Mapping[str, Any]) -> None:
        """A source's, a stateful instance's or a sink's report of this epoch's end."""
        kind = report.get("kind")
        if kind == "state":
            self.states[str(report.get("instance"))] = dict(report)
        elif kind == "source":
            self.sources[str(report.get("id"))] = dict(report)
        elif kind == "sink":
            self.sinks[str(report.get("id"))] = dict(report)


class Epochs:
    """One app's checkpoint epochs on its scheduler: the one being cut (``pending``),
    the next number, and the holders of fragments older than the last commit that
    may go once the record naming that commit is stored."""

    __slots__ = ("next_epoch", "pending", "unsaved_holders")

    def __init__(self) -> None:
        self.pending: Epoch | None = None
        self.next_epoch: int | None = None
        #: holders of committed epochs whose older fragments are not dropped yet (the
        #: record naming a newer epoch could not be stored)
        self.unsaved_holders: set[Address] = set()

    def cut(
        self, committed: dict[str, Any] | None, generation: int, now: float, waited: float = 0.0
    ) -> Epoch:
        """Start the next epoch after the last ``committed`` and any cut before."""
        first = 1 + int((committed or {}).get("epoch", 0))
        epoch = max(self.next_epoch or first, first)
        self.next_epoch = epoch + 1
        self.pending = Epoch(epoch, now, generation, waited)
        return self.pending

    def overdue(self, now: float, interval: float) -> bool:
        """Whether no epoch is being cut, or the one being cut is given up on."""
        pending = self.pending
        return pending is None or now - pending.started >= max(10.0, 3 * interval)

    def drop(self, epoch: int | None = None) -> None:
        """Forget the epoch being cut (only if it is ``epoch``, when given)."""
        if epoch is None or (self.pending is not None and self.pending.epoch == epoch):
            self.pending = None

    def complete(
        self,
        spec: AppSpec,
        sources: Iterable[str],
        sinks: Iterable[str],
        sinks_done: Iterable[str],
        placement: Mapping[str, Iterable[str]],
    ) -> bool:
        """Whether every source, every sink still running and every stateful
        operator's instance reported the end of the epoch being cut."""
        pending = self.pending
        if pending is None or set(pending.sources) < set(sources):
            return False
        if not set(sinks) - set(sinks_done) <= set(pending.sinks):
            return False
        covered = {(op, r.get("peer")) for r in pending.states.values() for op in r["ops"]}
        needed = {(o.id, peer) for o in spec.operators if o.stateful for peer in placement[o.id]}
        return needed <= covered

    def commit(self, old_holders: set[Address], now: float, at: float) -> dict[str, Any]:
        """The epoch being cut as a committed checkpoint (what the app record keeps);
        ``old_holders``, those of the commit it replaces, are noted as unsaved."""
        pending = self.pending
        assert pending is not None
        self.pending = None
        states = [
            {k: r[k] for k in ("peer", "ops", "instance", "holders", "m", "k", "bytes")}
            for r in pending.states.values()
        ]
        self.unsaved_holders.update(old_holders)
        replay = {sid: r["replay"] for sid, r in pending.sources.items() if r.get("replay")}
        return {
            "epoch": pending.epoch,
            "sources": {sid: int(r.get("offset", 0)) for sid, r in pending.sources.items()},
            # the packet ids a moved mqtt source drops: only apps that have such sources
            **({"replay": replay} if replay else {}),
            "sinks": {sid: r.get("commit") for sid, r in pending.sinks.items()},
            "states": states,
            "bytes": sum(int(r["bytes"]) for r in [*states, *_sink_states(pending.sinks)]),
            "store_s": max(
                (float(r.get("seconds", 0.0)) for r in pending.states.values()), default=0.0
            ),
            "cut_s": round(now - pending.started, 3),
            "waited_s": round(pending.waited, 3),
            "at": at,
        }

    def saved(self, holders_now: set[Address]) -> set[Address]:
        """The record naming the last commit (held by ``holders_now``) is stored: every
        holder whose older fragments may be dropped now."""
        holders = self.unsaved_holders | holders_now
        self.unsaved_holders = set()
        return holders


def _sink_states(sinks: Mapping[str, Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """What network sinks stored with the epoch (their reports' ``commit.state``)."""
    commits = [r.get("commit") for r in sinks.values()]
    return [c["state"] for c in commits if isinstance(c, dict) and c.get("state")]


def checkpointing(spec: AppSpec) -> tuple[int, int] | None:
    """(m, k) if the app checkpoints its state (mode erasure or replication, or auto
    with a stateful operator and a source that does not end), else None."""
    cp = spec.checkpoint
    if not spec.checkpointed:
        return None
    return (1, cp.k) if cp.mode == "replication" else (cp.m, cp.k)


def restore_plan(cp: dict[str, Any], moved: Mapping[str, str]) -> dict[str, Any]:
    """A deployment's ``restore`` from a committed checkpoint, dead peers' states given
    to the peers that took over from them."""
    return {
        "epoch": cp["epoch"],
        "sources": dict(cp["sources"]),
        "replay": dict(cp.get("replay", {})),
        "sinks": {k: v for k, v in cp["sinks"].items() if v is not None},
        "states": [{**e, "peer": moved.get(e["peer"], e["peer"])} for e in cp["states"]],
    }
