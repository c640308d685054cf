"""What stateful operators promise, and how each instance's state is protected.

Theory of operation (paper §IV-D, §VII-D). The paper adapts the recovery mechanism to
the application: a stateless operator has nothing to recover, and a stateful but
short-lived one is better off restarting empty, since fetching its state would cost
more than losing it. Only long-lived stateful operators are checkpointed, erasure-coded
to n = m + k leaf-set peers (:mod:`~agiledart.recovery.erasure`).

Choosing m and k. §VII-D (Fig. 11c) finds recovery time ~ m·B / (m + k - 1), B being
what each providing peer uploads: with m fixed it falls as k grows (more holders can
serve), with k fixed it rises with m (more fragments must all arrive). For a state of
S bytes, each of the m holders a restore reads from uploads S/m, so a larger m spreads
the transfer over more links, as long as the fragments are big enough for their
transfer, not a round trip, to dominate. Hence:

* k = 2 (:data:`DEFAULT_PARITY`), fewer if the leaf set is tiny: failures in a zone
  are correlated, so a holder may go down with the failed peer and another with it.
* m grows with the state, one per :data:`MIN_FRAGMENT_BYTES` (64 KiB: below that a
  fragment's round trip costs more than its transfer), up to the holders left after
  the k parity ones. A small state gets m = 1: k + 1 full copies (replication), one
  round trip to restore, and the extra storage is small in absolute terms.
* The interval keeps checkpoint traffic, S·(m + k)/m bytes each time, under a share of
  the uplink (:data:`CHECKPOINT_BYTES_PER_S`), within [5 s, 5 min], and short enough
  for ten checkpoints in the expected lifetime.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from agiledart.recovery.errors import CodecConfigError
from agiledart.recovery.fragment import MAX_FRAGMENTS

SHORT_LIVED_S = 600.0
"""Apps expected to live less than this restart empty instead of checkpointing."""
MIN_FRAGMENT_BYTES = 64 * 1024
DEFAULT_PARITY = 2
DEFAULT_HOLDERS = 8
"""Leaf-set peers that can hold fragments: the overlay's default leaf-set size."""
CHECKPOINT_BYTES_PER_S = 125_000.0
"""Share of an edge uplink (1 Mbit/s) that checkpoint traffic may use on average."""
MIN_INTERVAL_S = 5.0
MAX_INTERVAL_S = 300.0
MIN_CHECKPOINTS_PER_LIFETIME = 10


@runtime_checkable
class Snapshottable(Protocol):
    """A stateful operator instance: its state is opaque bytes to the recovery layer."""

    def snapshot(self) -> bytes:
        """The instance's state at the current barrier, as bytes."""
        ...

    def restore(self, state: bytes) -> None:
        """Replace the instance's state by one :meth:`snapshot` returned."""
        ...


class RecoveryMode(enum.Enum):
    RESTART = "restart"
    """No checkpoints: a failed instance restarts with empty state."""
    REPLICATION = "replication"
    """m = 1: k + 1 full copies on leaf-set peers."""
    ERASURE = "erasure"
    """m data and k parity fragments on m + k leaf-set peers."""


@dataclass(frozen=True, kw_only=True)
class CheckpointPolicy:
    """How one operator instance's state is protected; build with the class methods."""

    mode: RecoveryMode
    m: int = 1
    k: int = 0
    interval_s: float = math.inf

    def __post_init__(self) -> None:
        if self.mode is RecoveryMode.RESTART:
            ok = self.m == 1 and self.k == 0 and self.interval_s == math.inf
        else:
            ok = (
                (self.m == 1) == (self.mode is RecoveryMode.REPLICATION)
                and self.m >= 1
                and self.k >= 0
                and self.m + self.k <= MAX_FRAGMENTS
                and 0 < self.interval_s < math.inf
            )
        if not ok:
            msg = f"inconsistent policy {self!r}; use CheckpointPolicy.restart/replication/erasure"
            raise CodecConfigError(msg)

    @classmethod
    def restart(cls) -> CheckpointPolicy:
        return cls(mode=RecoveryMode.RESTART)

    @classmethod
    def replication(cls, *, copies: int, interval_s: float) -> CheckpointPolicy:
        return cls(mode=RecoveryMode.REPLICATION, m=1, k=copies - 1, interval_s=interval_s)

    @classmethod
    def erasure(cls, *, m: int, k: int, interval_s: float) -> CheckpointPolicy:
        return cls(mode=RecoveryMode.ERASURE, m=m, k=k, interval_s=interval_s)

    @property
    def n(self) -> int:
        """Fragments per stripe, one per holder (0 when nothing is stored)."""
        return 0 if self.mode is RecoveryMode.RESTART else self.m + self.k


def default_policy(
    state_bytes: int,
    expected_lifetime_s: float,
    stateless: bool,
    *,
    holders: int = DEFAULT_HOLDERS,
) -> CheckpointPolicy:
    """The paper's adaptive choice for an instance (see the module docstring).

    ``expected_lifetime_s`` may be ``math.inf`` (runs until stopped); ``holders`` is the
    number of leaf-set peers available to hold fragments (0: restart only).
    """
    if state_bytes < 0 or holders < 0 or not expected_lifetime_s >= 0:  # NaN too
        msg = (
            f"need state_bytes >= 0, expected_lifetime_s >= 0, holders >= 0; got "
            f"{state_bytes}, {expected_lifetime_s}, {holders}"
        )
        raise CodecConfigError(msg)
    if stateless or state_bytes == 0 or expected_lifetime_s < SHORT_LIVED_S or holders == 0:
        return CheckpointPolicy.restart()
    holders = min(holders, MAX_FRAGMENTS)
    k = min(DEFAULT_PARITY, holders - 1)
    m = max(1, min(state_bytes // MIN_FRAGMENT_BYTES, holders - k))
    upload_s = state_bytes * (m + k) / m / CHECKPOINT_BYTES_PER_S
    ceiling = min(MAX_INTERVAL_S, expected_lifetime_s / MIN_CHECKPOINTS_PER_LIFETIME)
    interval_s = max(MIN_INTERVAL_S, min(upload_s, ceiling))
    if m == 1:
        return CheckpointPolicy.replication(copies=k + 1, interval_s=interval_s)
    return CheckpointPolicy.erasure(m=m, k=k, interval_s=interval_s)
