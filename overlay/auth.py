"""Message authentication under the cluster key.

Every UDP datagram is sealed as::

    version (1) | timestamp ms (8, big-endian) | nonce (8) | payload | HMAC-SHA256 (32)

The MAC covers everything before it. :meth:`DatagramAuth.open` accepts a datagram only
if the MAC verifies, the timestamp lies within ``window_s`` of the receiver's clock, and
the ``(timestamp, nonce)`` pair has not been accepted before. The replay cache is
bounded: when it must evict, it raises a floor below which every timestamp is refused,
so eviction can never re-admit a replay (theory: the sliding-window replay protection
of IPsec, RFC 4303 §3.4.3, with time in place of a sequence number).

TCP frames use per-connection session keys instead (see ``frames.py``).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .errors import AuthError, ConfigError, OversizeError, ReplayError

VERSION = 1
HEADER = 17
MAC = 32
MAX_DATAGRAM = 8192
ENV_KEY = "AGILEDART_CLUSTER_KEY"
ENV_KEY_FILE = "AGILEDART_CLUSTER_KEY_FILE"  #: a key file by environment (docker secrets)
MIN_KEY_CHARS = 16

__all__ = ["ClusterKey", "DatagramAuth", "load_cluster_key"]

HOW_TO_MAKE_A_KEY = (
    "create one with `agiledart keygen --out cluster.key` and pass "
    "`--cluster-key-file cluster.key` (or set AGILEDART_CLUSTER_KEY), "
    "or run with `--insecure` on a trusted test network"
)


@dataclass(frozen=True, slots=True)
class ClusterKey:
    """The shared secret of a cluster; ``secret`` is already a derived 32-byte key."""

    secret: bytes
    insecure: bool = False

    @classmethod
    def from_material(cls, material: str | bytes) -> ClusterKey:
        raw = material.encode() if isinstance(material, str) else material
        raw = raw.strip()
        if len(raw) < MIN_KEY_CHARS:
            msg = f"the cluster key is too short ({len(raw)} chars, need {MIN_KEY_CHARS})"
            raise ConfigError(msg)
        return cls(hashlib.sha256(b"agiledart-cluster-key\0" + raw).digest())

    @classmethod
    def for_insecure_mode(cls) -> ClusterKey:
        """A well-known key: frames stay well-formed, but anyone can forge them."""
        return cls(hashlib.sha256(b"agiledart-insecure\0").digest(), insecure=True)

    def derive(self, purpose: bytes) -> bytes:
        return hmac.new(self.secret, purpose, hashlib.sha256).digest()


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
            return ClusterKey.from_material(path.read_bytes())
        except OSError as exc:
            msg = f"cannot read cluster key file {path}: {exc.strerror}"
            raise ConfigError(msg) from exc
    if env.get(ENV_KEY):
        return ClusterKey.from_material(env[ENV_KEY])
    if insecure:
        return ClusterKey.for_insecure_mode()
    msg = f"no cluster key: {HOW_TO_MAKE_A_KEY}"
    raise ConfigError(msg)


class DatagramAuth:
    """Seals and opens datagrams; pure apart from the clock and RNG it is given."""

    def __init__(
        self,
        key: ClusterKey,
        *,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        window_s: float = 60.0,
        replay_capacity: int = 200_000,
        max_size: int = MAX_DATAGRAM,
    ) -> None:
        self._key = key.derive(b"datagram")
        self._clock = clock
        self._randbytes = (rng or random.SystemRandom()).randbytes
        self._window_ms = int(window_s * 1000)
        self._capacity = replay_capacity
        self._max_size = max_size
        self._seen: set[bytes] = set()
        self._order: deque[tuple[int, bytes]] = deque()
        self._floor_ms = 0

    def seal(self, payload: bytes) -> bytes:
        now_ms = int(self._clock() * 1000)
        head = bytes([VERSION]) + now_ms.to_bytes(8, "big") + self._randbytes(8)
        body = head + payload
        out = body + hmac.new(self._key, body, hashlib.sha256).digest()
        if len(out) > self._max_size:
            msg = f"datagram of {len(out)} bytes exceeds the {self._max_size}-byte limit"
            raise OversizeError(msg)
        return out

    def open(self, datagram: bytes) -> bytes:
        """The payload of an authentic, fresh datagram; else one :class:`BadMessage`."""
        size = len(datagram)
        if size > self._max_size:
            msg = f"datagram of {size} bytes exceeds the {self._max_size}-byte limit"
            raise OversizeError(msg)
        if size < HEADER + MAC or datagram[0] != VERSION:
            msg = "not an agiledart datagram"
            raise AuthError(msg)
        body, tag = datagram[:-MAC], datagram[-MAC:]
        if not hmac.compare_digest(tag, hmac.new(self._key, body, hashlib.sha256).digest()):
            msg = "bad datagram MAC"
            raise AuthError(msg)
        ts_ms = int.from_bytes(body[1:9], "big")
        now_ms = int(self._clock() * 1000)
        if abs(now_ms - ts_ms) > self._window_ms or ts_ms < self._floor_ms:
            msg = "datagram timestamp outside the replay window"
            raise ReplayError(msg)
        stamp = body[1:HEADER]
        if stamp in self._seen:
            msg = "datagram replayed"
            raise ReplayError(msg)
        self._remember(ts_ms, stamp, now_ms)
        return body[HEADER:]

    def _remember(self, ts_ms: int, stamp: bytes, now_ms: int) -> None:
        order, seen = self._order, self._seen
        horizon = now_ms - self._window_ms
        while order and (order[0][0] < horizon or len(order) >= self._capacity):
            old_ts, old = order.popleft()
            seen.discard(old)
            self._floor_ms = max(self._floor_ms, old_ts + 1)
        seen.add(stamp)
        order.append((ts_ms, stamp))
