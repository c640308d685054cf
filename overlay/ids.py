"""Node ids and keys in kademlia's 160-bit space.

A node id is an ``int`` in ``[0, 2**160)``; on the wire it travels as 20 big-endian
bytes. Keys are derived from names with SHA-1 (the digest size kademlia uses), so the
key of a peer name and the id of that peer are distinct things: a JOIN toward the sink
routes to the sink peer's *id*, which any peer learns from the ring.

A peer's id is stable across restarts: it is drawn once and persisted in
``<state-dir>/node_id`` (40 hex characters and a newline, human-readable).
"""

from __future__ import annotations

import hashlib
import secrets
from pathlib import Path

from .errors import ConfigError
from .files import atomic_write

ID_BITS = 160
ID_BYTES = ID_BITS // 8
ID_SPACE = 1 << ID_BITS

__all__ = [
    "ID_BITS",
    "ID_BYTES",
    "ID_SPACE",
    "common_prefix_bits",
    "from_bytes",
    "key_for",
    "load_or_create_node_id",
    "random_id",
    "short",
    "to_bytes",
]


def to_bytes(node_id: int) -> bytes:
    return node_id.to_bytes(ID_BYTES, "big")


def from_bytes(raw: bytes) -> int:
    if len(raw) != ID_BYTES:
        msg = f"a node id is {ID_BYTES} bytes, got {len(raw)}"
        raise ValueError(msg)
    return int.from_bytes(raw, "big")


def key_for(name: str | bytes) -> int:
    """The 160-bit key of a name (SHA-1, as kademlia digests keys)."""
    raw = name.encode() if isinstance(name, str) else name
    return int.from_bytes(hashlib.sha1(raw).digest(), "big")


def random_id(rng: object | None = None) -> int:
    """A uniformly random id; ``rng`` is a ``random.Random`` for deterministic tests."""
    getrandbits = getattr(rng, "getrandbits", None)
    if getrandbits is not None:
        return int(getrandbits(ID_BITS))
    return secrets.randbits(ID_BITS)


def common_prefix_bits(a: int, b: int) -> int:
    """How many leading bits of ``a`` and ``b`` agree (160 when equal)."""
    return ID_BITS - (a ^ b).bit_length()


def short(node_id: int) -> str:
    """The first 8 hex digits, for logs and tables."""
    return f"{node_id:040x}"[:8]


def load_or_create_node_id(state_dir: Path | str) -> int:
    """Read the persisted id of this peer, creating it on first start."""
    path = Path(state_dir) / "node_id"
    if path.exists():
        text = path.read_text().strip()
        try:
            value = int(text, 16)
        except ValueError:
            value = -1
        if len(text) != 2 * ID_BYTES or not 0 <= value < ID_SPACE:
            msg = f"{path} does not hold a 40-hex-digit node id; remove it to draw a new one"
            raise ConfigError(msg)
        return value
    path.parent.mkdir(parents=True, exist_ok=True)
    value = random_id()
    atomic_write(path, f"{value:040x}\n".encode())
    return value
