"""Cluster keys: made by ``agiledart keygen``, full strength only, with ids and rotation.

A key is 32 random bytes, written as ``agiledart-key-v1:`` and 43 base64url characters
(keys made before this format, 64 hex digits, are read too). Nothing else is accepted:
a pass phrase, however long, is refused with a message saying how to make a key, so the
MAC a peer shows any client in its handshake never lets a guess be tested offline.

A key file holds the current key on its first key line and, during a rotation, one more
key on its second; ``#`` lines are comments. Both keys are accepted; messages are sealed
with the first. Every message names its key by a 4-byte id, so the receiver picks the
right one (and can tell a key that differs from one that forged a MAC).

Sub-keys come from HKDF-SHA256 (RFC 5869): ``PRK = Extract("agiledart cluster key v1",
key)`` once, then ``Expand(PRK, purpose)`` per use (datagrams, frames, the key id, the
dashboard token), so no two uses ever share a key.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import random
import re
import secrets
from dataclasses import dataclass

from .errors import ConfigError

PREFIX = "agiledart-key-v1:"
KEY_BYTES = 32
KEY_ID_BYTES = 4
MIN_DISTINCT_BYTES = 12  #: 32 random bytes have ~30 distinct values; 12 or fewer: made by hand
_SALT = b"agiledart cluster key v1"
_HEX = re.compile(r"[0-9a-fA-F]{64}")

HOW_TO_MAKE_A_KEY = (
    "create one with `agiledart keygen --out cluster.key` and pass "
    "`--cluster-key-file cluster.key` (or set AGILEDART_CLUSTER_KEY), "
    "or run with `--insecure` on a trusted test network"
)

__all__ = [
    "HOW_TO_MAKE_A_KEY",
    "KEY_ID_BYTES",
    "PREFIX",
    "ClusterKey",
    "hkdf_expand",
    "hkdf_extract",
    "make_key_text",
    "parse_keys",
]


def hkdf_extract(salt: bytes, ikm: bytes) -> bytes:
    return hmac.new(salt, ikm, hashlib.sha256).digest()


def hkdf_expand(prk: bytes, info: bytes, length: int = 32) -> bytes:
    out, block, counter = b"", b"", 1
    while len(out) < length:
        block = hmac.new(prk, block + info + bytes([counter]), hashlib.sha256).digest()
        out += block
        counter += 1
    return out[:length]


def make_key_text(rng: random.Random | None = None) -> str:
    """A new key as one line (``rng`` only for reproducible test keys)."""
    raw = rng.randbytes(KEY_BYTES) if rng is not None else secrets.token_bytes(KEY_BYTES)
    return PREFIX + base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _parse_one(token: str) -> bytes:
    raw: bytes | None = None
    if token.startswith(PREFIX):
        body = token[len(PREFIX) :]
        if len(body) == 43:
            try:
                raw = base64.urlsafe_b64decode(body + "=")
            except (binascii.Error, ValueError):
                raw = None
    elif _HEX.fullmatch(token):
        raw = bytes.fromhex(token)
    if raw is None or len(raw) != KEY_BYTES:
        msg = (
            "the cluster key is not one `agiledart keygen` makes "
            f"({PREFIX} and 43 base64url characters); {HOW_TO_MAKE_A_KEY}"
        )
        raise ConfigError(msg)
    if len(set(raw)) <= MIN_DISTINCT_BYTES:
        msg = (
            f"the cluster key is too regular to be random ({len(set(raw))} distinct bytes "
            f"of 32); {HOW_TO_MAKE_A_KEY}"
        )
        raise ConfigError(msg)
    return raw


def parse_keys(text: str) -> list[bytes]:
    """The keys of a key file (or ``$AGILEDART_CLUSTER_KEY``): current first, at most two."""
    tokens = [
        token
        for line in text.splitlines()
        if not line.lstrip().startswith("#")
        for token in re.split(r"[\s,]+", line.strip())
        if token
    ]
    if not tokens:
        msg = f"no cluster key in it: {HOW_TO_MAKE_A_KEY}"
        raise ConfigError(msg)
    keys = [_parse_one(t) for t in tokens]  # anything but keygen's keys: say how to make one
    if len(keys) > 2:
        msg = (
            f"{len(keys)} keys: a cluster key file holds the current key and, during a "
            "rotation, one more"
        )
        raise ConfigError(msg)
    return keys


@dataclass(frozen=True, slots=True)
class ClusterKey:
    """The keys of a cluster as HKDF pseudo-random keys: ``secret`` seals, every one of
    ``accepted`` (``secret`` first) opens."""

    secret: bytes
    accepted: tuple[bytes, ...] = ()
    insecure: bool = False

    def __post_init__(self) -> None:
        if not self.accepted:
            object.__setattr__(self, "accepted", (self.secret,))

    @classmethod
    def from_raw(cls, *raw: bytes) -> ClusterKey:
        prks = tuple(dict.fromkeys(hkdf_extract(_SALT, r) for r in raw))
        return cls(prks[0], prks)

    @classmethod
    def from_material(cls, material: str | bytes) -> ClusterKey:
        """The keys of a key file's text (or ``$AGILEDART_CLUSTER_KEY``)."""
        text = material.decode(errors="replace") if isinstance(material, bytes) else material
        return cls.from_raw(*parse_keys(text))

    @classmethod
    def generate(cls, rng: random.Random | None = None) -> ClusterKey:
        return cls.from_material(make_key_text(rng))

    @classmethod
    def for_insecure_mode(cls) -> ClusterKey:
        """A well-known key: frames stay well-formed, but anyone can forge them."""
        return cls(hashlib.sha256(b"agiledart-insecure\0").digest(), insecure=True)

    @property
    def key_id(self) -> bytes:
        """The id of the key that seals."""
        return _key_id(self.secret)

    def derive(self, purpose: bytes) -> bytes:
        """A 32-byte sub-key of the sealing key for one purpose."""
        return hkdf_expand(self.secret, purpose)

    def derive_all(self, purpose: bytes) -> dict[bytes, bytes]:
        """The sub-key for one purpose of every accepted key, by key id."""
        return {_key_id(prk): hkdf_expand(prk, purpose) for prk in self.accepted}

    def derive_for(self, key_id: bytes, purpose: bytes) -> bytes | None:
        """The sub-key of the accepted key with this id; None if no key of ours has it."""
        for prk in self.accepted:
            if hmac.compare_digest(_key_id(prk), key_id):
                return hkdf_expand(prk, purpose)
        return None


def _key_id(prk: bytes) -> bytes:
    return hkdf_expand(prk, b"agiledart key id", KEY_ID_BYTES)


ROTATION_STEPS = ("add", "promote", "retire")
FILE_HEADER = (
    "# agiledart cluster key: keep it secret (mode 0600). The first key seals; a second,\n"
    "# during a rotation, is accepted too. Made by `agiledart keygen`.\n"
)


def key_file_text(keys: list[str]) -> str:
    return FILE_HEADER + "".join(f"{k}\n" for k in keys)


def rotate(text: str, step: str, rng: random.Random | None = None) -> tuple[str, str]:
    """The key file after one rotation step, and what the step did, in words:

    ``add``      a new key accepted beside the current one (which still seals);
    ``promote``  the new key seals, the old one is still accepted;
    ``retire``   the old key is no longer accepted.
    """
    tokens = [
        t
        for line in text.splitlines()
        if not line.lstrip().startswith("#")
        for t in re.split(r"[\s,]+", line.strip())
        if t
    ]
    parse_keys("\n".join(tokens))  # refuses a file that is not a valid key file
    if step == "add":
        if len(tokens) != 1:
            msg = "a rotation is already under way (the file holds two keys): promote or retire"
            raise ConfigError(msg)
        return key_file_text([tokens[0], make_key_text(rng)]), "added a new key, accepted only"
    if len(tokens) != 2:
        msg = f"`--rotate {step}` needs a file of two keys: run `--rotate add` first"
        raise ConfigError(msg)
    if step == "promote":
        return key_file_text([tokens[1], tokens[0]]), "the new key now seals; the old is accepted"
    if step == "retire":
        return key_file_text([tokens[0]]), "the second key is no longer accepted"
    msg = f"--rotate takes {', '.join(ROTATION_STEPS)}, not {step!r}"
    raise ConfigError(msg)
