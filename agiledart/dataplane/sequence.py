"""Receiver-side sequence tracking for one edge: drop duplicates, detect gaps.

Batches on an edge are numbered 0, 1, 2, ... by the sender's
:class:`~agiledart.dataplane.batcher.Batcher`. The tracker keeps the next expected
number plus the set of numbers received ahead of it; that set is bounded by the
credit window (only credited data can be in flight). ``missing()`` lists the gaps,
which later exactly-once/replay work asks the upstream buffer to resend.
"""

from __future__ import annotations

from dataclasses import dataclass

from agiledart.dataplane.errors import DataPlaneUsageError

__all__ = ["SequenceStatistics", "SequenceTracker"]


@dataclass(frozen=True, slots=True)
class SequenceStatistics:
    next_expected: int
    delivered: int
    duplicates: int
    gaps_detected: int  # times a number arrived with some earlier one missing
    missing: int  # numbers currently missing below the highest seen


class SequenceTracker:
    """``accept(seq)`` is True for a new batch, False for a duplicate to drop."""

    __slots__ = ("_ahead", "_delivered", "_duplicates", "_gaps", "next_expected")

    def __init__(self, *, next_expected: int = 0) -> None:
        if next_expected < 0:
            msg = f"next_expected must be >= 0, got {next_expected}"
            raise DataPlaneUsageError(msg)
        self.next_expected = next_expected
        self._ahead: set[int] = set()
        self._delivered = 0
        self._duplicates = 0
        self._gaps = 0

    def accept(self, seq: int) -> bool:
        nxt = self.next_expected
        if seq == nxt and not self._ahead:  # the common, in-order case
            self.next_expected = nxt + 1
            self._delivered += 1
            return True
        ahead = self._ahead
        if seq < nxt or seq in ahead:
            self._duplicates += 1
            return False
        self._delivered += 1
        if seq == nxt:
            nxt += 1
            while nxt in ahead:
                ahead.remove(nxt)
                nxt += 1
            self.next_expected = nxt
        else:
            if seq - 1 not in ahead:
                self._gaps += 1
            ahead.add(seq)
        return True

    def missing(self) -> list[tuple[int, int]]:
        """Gaps as half-open ranges ``[start, end)`` below the highest number seen."""
        gaps: list[tuple[int, int]] = []
        lo = self.next_expected
        for s in sorted(self._ahead):
            if s > lo:
                gaps.append((lo, s))
            lo = s + 1
        return gaps

    def statistics(self) -> SequenceStatistics:
        n_missing = sum(end - start for start, end in self.missing())
        return SequenceStatistics(
            self.next_expected, self._delivered, self._duplicates, self._gaps, n_missing
        )
