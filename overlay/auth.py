"""Message authentication under the cluster key.

Every UDP datagram is sealed as::

    version (1) | key id (4) | timestamp ms (8) | nonce (8) | recipient id (20)
    | sender's port (2) | payload | HMAC-SHA256 (32)

under the datagram sub-key of the key the id names (``keys.py``). The MAC covers
everything before it, so a datagram is bound to the peer it was sent to: the recipient
is that peer's node id, or all zeros for a request to an address whose peer is not yet
known (a bootstrap ping). :meth:`DatagramAuth.open` accepts a datagram only if its key
is one of ours, the MAC verifies, it is addressed to us (or to anyone), its timestamp
lies no more than ``future_s`` ahead of the receiver's clock and ``window_s`` behind
it, and not before this process started (so a restart does not reopen the replay
window), and the ``(timestamp, nonce)`` pair has not been accepted before.

The replay cache remembers every accepted stamp until it leaves the window. Sized for
``replay_capacity`` datagrams a window, it evicts by time: when it must make room it
drops the *oldest timestamp* and raises a floor just above it, below which everything is
refused, so eviction never re-admits a replay and the floor never passes a stamp younger
than everything remembered (theory: the sliding-window replay protection of IPsec,
RFC 4303 §3.4.3, with time in place of a sequence number).

A timestamp outside the window is a :class:`ClockSkewError` whose message names the
skew: peers log it as a warning that says to check the clock, since a Pi without a
real-time clock would otherwise be cut off without a word.

TCP frames use per-connection session keys instead (see ``frames.py``).
"""

from __future__ import annotations

import hashlib
import heapq
import hmac
import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from .errors import AuthError, ClockSkewError, ConfigError, KeyMismatch, OversizeError, ReplayError
from .keys import HOW_TO_MAKE_A_KEY, KEY_ID_BYTES, ClusterKey

VERSION = 2
ID_BYTES = 20
ANYONE = bytes(ID_BYTES)  #: the recipient of a request to a peer not yet known
HEADER = 1 + KEY_ID_BYTES + 8 + 8 + ID_BYTES + 2
MAC = 32
MAX_DATAGRAM = 8192
ENV_KEY = "AGILEDART_CLUSTER_KEY"
ENV_KEY_FILE = "AGILEDART_CLUSTER_KEY_FILE"  #: a key file by environment (docker secrets)
PURPOSE = b"agiledart datagram v2"

__all__ = ["ANYONE", "ClusterKey", "DatagramAuth", "Opened", "load_cluster_key"]


class Opened(NamedTuple):  # a tuple: one per datagram, made fast
    """An authentic, fresh datagram."""

    payload: bytes
    to_us: bool  #: addressed to this peer's id (not to anyone)
    port: int  #: the port its sender says it listens on


def load_cluster_key(
    key_file: str | Path | None, *, insecure: bool, environ: dict[str, str] | None = None
) -> ClusterKey:
    """The key from ``--cluster-key-file``, else the file ``$AGILEDART_CLUSTER_KEY_FILE``
    names (a docker secret, say), else ``$AGILEDART_CLUSTER_KEY``, else refuse."""
    env = os.environ if environ is None else environ
    if key_file is None and env.get(ENV_KEY_FILE):
        key_file = env[ENV_KEY_FILE]
    if key_file is not None:
        path = Path(key_file)
        try:
            text = path.read_bytes()
        except OSError as exc:
            msg = f"cannot read cluster key file {path}: {exc.strerror}"
            raise ConfigError(msg) from exc
        try:
            return ClusterKey.from_material(text)
        except ConfigError as exc:
            msg = f"cluster key file {path}: {exc}"
            raise ConfigError(msg) from None
    if env.get(ENV_KEY):
        try:
            return ClusterKey.from_material(env[ENV_KEY])
        except ConfigError as exc:
            msg = f"${ENV_KEY}: {exc}"
            raise ConfigError(msg) from None
    if insecure:
        return ClusterKey.for_insecure_mode()
    msg = f"no cluster key: {HOW_TO_MAKE_A_KEY}"
    raise ConfigError(msg)


class DatagramAuth:
    """Seals and opens the datagrams of one peer; pure apart from the clock and RNG."""

    def __init__(
        self,
        key: ClusterKey,
        *,
        local_id: bytes = ANYONE,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        window_s: float = 60.0,
        future_s: float = 5.0,
        replay_capacity: int = 200_000,
        max_size: int = MAX_DATAGRAM,
    ) -> None:
        self._seal_key = key.derive(PURPOSE)
        self._key_id = key.key_id
        self._open_keys = key.derive_all(PURPOSE)  # by key id: computed once
        self._local_id = local_id
        self._clock = clock
        self._randbytes = (rng or random.SystemRandom()).randbytes
        self._window_ms = int(window_s * 1000)
        self._future_ms = int(future_s * 1000)
        self._capacity = replay_capacity
        self._max_size = max_size
        self._seen: set[bytes] = set()
        self._by_time: list[tuple[int, bytes]] = []  # a heap: the oldest timestamp first
        self.started_ms = int(clock() * 1000)
        self._floor_ms = self.started_ms

    def seal(self, payload: bytes, *, to: bytes = ANYONE, port: int = 0) -> bytes:
        now_ms = int(self._clock() * 1000)
        body = b"".join(
            (
                bytes([VERSION]),
                self._key_id,
                now_ms.to_bytes(8, "big"),
                self._randbytes(8),
                to,
                port.to_bytes(2, "big"),
                payload,
            )
        )
        out = body + hmac.new(self._seal_key, body, hashlib.sha256).digest()
        if len(out) > self._max_size:
            msg = f"datagram of {len(out)} bytes exceeds the {self._max_size}-byte limit"
            raise OversizeError(msg)
        return out

    def open(self, datagram: bytes) -> Opened:
        """An authentic, fresh datagram addressed to us; else one :class:`BadMessage`."""
        size = len(datagram)
        if size > self._max_size:
            msg = f"datagram of {size} bytes exceeds the {self._max_size}-byte limit"
            raise OversizeError(msg)
        if size < HEADER + MAC or datagram[0] != VERSION:
            msg = "not an agiledart datagram (or one of another version)"
            raise AuthError(msg)
        body, tag = datagram[:-MAC], datagram[-MAC:]
        key = self._open_keys.get(body[1:5])
        if key is None:
            raise KeyMismatch
        if not hmac.compare_digest(tag, hmac.new(key, body, hashlib.sha256).digest()):
            msg = "bad datagram MAC"
            raise AuthError(msg)
        to = body[21:41]
        if to != self._local_id and to != ANYONE:
            msg = "datagram addressed to another peer"
            raise ReplayError(msg)
        ts_ms = int.from_bytes(body[5:13], "big")
        now_ms = int(self._clock() * 1000)
        self._check_time(ts_ms, now_ms)
        stamp = body[5:21]
        if stamp in self._seen:
            msg = "datagram replayed"
            raise ReplayError(msg)
        self._remember(ts_ms, stamp, now_ms)
        return Opened(body[HEADER:], to != ANYONE, int.from_bytes(body[41:43], "big"))

    def _check_time(self, ts_ms: int, now_ms: int) -> None:
        if ts_ms > now_ms + self._future_ms or ts_ms < now_ms - self._window_ms:
            skew_s = (ts_ms - now_ms) / 1000
            way = "ahead of" if skew_s > 0 else "behind"
            msg = (
                f"a datagram stamped {abs(skew_s):.1f} s {way} this peer's clock (accepted: "
                f"{self._future_ms / 1000:g} s ahead, {self._window_ms / 1000:g} s behind): "
                "check the clock (NTP) of both hosts"
            )
            raise ClockSkewError(msg, skew_s=skew_s)
        if ts_ms < self.started_ms:
            msg = "datagram stamped before this peer started"
            raise ReplayError(msg)
        if ts_ms < self._floor_ms:
            msg = "datagram older than the replay cache remembers"
            raise ReplayError(msg)

    def _remember(self, ts_ms: int, stamp: bytes, now_ms: int) -> None:
        by_time, seen = self._by_time, self._seen
        horizon = now_ms - self._window_ms
        while by_time and (by_time[0][0] < horizon or len(by_time) >= self._capacity):
            old_ts, old = heapq.heappop(by_time)
            seen.discard(old)
            self._floor_ms = max(self._floor_ms, old_ts + 1)
        seen.add(stamp)
        heapq.heappush(by_time, (ts_ms, stamp))
