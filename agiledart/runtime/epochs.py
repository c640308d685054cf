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
on leaf-set peers in the background (:mod:`agiledart.runtime.checkpoints`). A sink
commits what it wrote before E (a file sink: flushed, fsynced, its size noted). Each
reports to the scheduler, which commits E once the sources, every stateful instance
and every sink have reported; after a failure the app rolls back to the last committed
epoch as a whole: states restored, sources replayed from their offsets, file sinks
truncated to their committed size, so the output is exactly that of a run without the
failure.

A channel that delivered its final watermark is *finished*: alignment no longer waits
for it (a source that ended sends no more barriers).
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["CHECKPOINT_RATE", "Alignment", "Channel", "Pacer"]

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
