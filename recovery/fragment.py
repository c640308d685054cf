"""One erasure-coded fragment of one stripe of a checkpoint, and its wire format.

A fragment carries everything needed to check it alone and to decode it with any m-1
others (it stores k, m, the fragment index, the padding length and a digest
with every fragment). On the wire it is one msgpack array::

    [1, app, instance, epoch, stripe, last, index, m, k, length, padding,
     state_digest, block_digest, block]

``block_digest`` is sha256 over the msgpack encoding of the header (everything before
it) followed by the block, so a flipped bit anywhere in a fragment, header or block,
fails :meth:`Fragment.verify`. ``state_digest`` is sha256 of the state from its first
byte through the end of this fragment's stripe: in the last stripe (and so in every
fragment of a single-stripe state) it is the digest of the whole state.

:meth:`Fragment.from_bytes` checks structure only (bounded sizes, field types and
ranges, a consistent layout) and does not hash; decoding verifies each fragment it uses.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from typing import Any

import msgpack

from agiledart.recovery.errors import FragmentError, RecoveryError

FORMAT_VERSION = 1
MAX_FRAGMENTS = 256
"""n = m + k is at most 256: zfec works in GF(2^8)."""
MAX_BLOCK_SIZE = 4 * 1024 * 1024
"""Largest block one fragment may carry; the default is 1 MiB (see ``erasure``)."""
MAX_ID_CHARS = 256
MAX_EPOCH = 2**63 - 1
MAX_STRIPES = 2**32
DIGEST_SIZE = 32
MAX_WIRE_SIZE = MAX_BLOCK_SIZE + 4 * MAX_ID_CHARS * 2 + 256
"""Upper bound on :meth:`Fragment.to_bytes`; longer input is refused unread."""
_FIELDS = 14


@dataclass(frozen=True, slots=True)
class CheckpointId:
    """Which checkpoint a fragment belongs to: an operator instance's state at an epoch."""

    app: str
    instance: str
    epoch: int


@dataclass(frozen=True, slots=True)
class Fragment:
    """Block ``index`` of n = m + k zfec-encoded blocks of stripe ``stripe`` of a state.

    ``length`` is the number of state bytes in the stripe, ``padding`` the zero bytes
    appended to it so that it splits into m blocks of ``ceil(length / m)`` bytes.
    Build fragments with :func:`~agiledart.recovery.erasure.encode` or
    :meth:`from_bytes`, not by hand.
    """

    app: str
    instance: str
    epoch: int
    stripe: int
    last: bool
    index: int
    m: int
    k: int
    length: int
    padding: int
    state_digest: bytes
    block_digest: bytes
    block: bytes = field(repr=False)

    @property
    def n(self) -> int:
        return self.m + self.k

    @property
    def checkpoint(self) -> CheckpointId:
        return CheckpointId(self.app, self.instance, self.epoch)

    def header(self) -> list[Any]:
        """The fields covered by ``block_digest``, in wire order."""
        return [
            FORMAT_VERSION,
            self.app,
            self.instance,
            self.epoch,
            self.stripe,
            self.last,
            self.index,
            self.m,
            self.k,
            self.length,
            self.padding,
            self.state_digest,
        ]

    def sealed(self) -> Fragment:
        """This fragment with ``block_digest`` computed from its header and block."""
        return replace(self, block_digest=block_digest(self.header(), self.block))

    def to_bytes(self) -> bytes:
        return msgpack.packb([*self.header(), self.block_digest, self.block])

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview) -> Fragment:
        """Parse one fragment; any malformed input raises :class:`FragmentError`, only."""
        if len(data) > MAX_WIRE_SIZE:
            msg = f"fragment of {len(data)} bytes exceeds {MAX_WIRE_SIZE}"
            raise FragmentError(msg)
        try:
            fields = msgpack.unpackb(
                data,
                raw=False,
                use_list=True,
                strict_map_key=True,
                max_str_len=4 * MAX_ID_CHARS,
                max_bin_len=MAX_BLOCK_SIZE,
                max_array_len=_FIELDS,
                max_map_len=0,
                max_ext_len=0,
            )
        except Exception as exc:  # msgpack's own tree is wide (ValueError, TypeError, ...)
            msg = f"undecodable fragment: {exc}"
            raise FragmentError(msg) from exc
        if type(fields) is not list or len(fields) != _FIELDS:
            msg = f"a fragment is a msgpack array of {_FIELDS} fields"
            raise FragmentError(msg)
        if type(fields[0]) is not int or fields[0] != FORMAT_VERSION:
            msg = f"unknown fragment format {fields[0]!r}"
            raise FragmentError(msg)
        fragment = cls(*fields[1:])  # fields are declared in wire order
        fragment.check_layout()
        return fragment

    def check_layout(self) -> None:
        """Raise :class:`FragmentError` unless every field has its type, range and fit."""
        check_str("app", self.app)
        check_str("instance", self.instance)
        check_int("epoch", self.epoch, 0, MAX_EPOCH)
        check_int("stripe", self.stripe, 0, MAX_STRIPES - 1)
        if type(self.last) is not bool:
            msg = "last must be a bool"
            raise FragmentError(msg)
        check_int("m", self.m, 1, MAX_FRAGMENTS)
        check_int("k", self.k, 0, MAX_FRAGMENTS - self.m)
        check_int("index", self.index, 0, self.n - 1)
        for name, digest in (
            ("state_digest", self.state_digest),
            ("block_digest", self.block_digest),
        ):
            if type(digest) is not bytes or len(digest) != DIGEST_SIZE:
                msg = f"{name} must be {DIGEST_SIZE} bytes"
                raise FragmentError(msg)
        if type(self.block) is not bytes or len(self.block) > MAX_BLOCK_SIZE:
            msg = f"block must be at most {MAX_BLOCK_SIZE} bytes"
            raise FragmentError(msg)
        check_int("length", self.length, 0, self.m * MAX_BLOCK_SIZE)
        size = len(self.block)
        if size != -(-self.length // self.m) or self.padding != self.m * size - self.length:
            msg = (
                f"block of {size} bytes, length {self.length} and padding {self.padding} "
                f"do not fit m={self.m}"
            )
            raise FragmentError(msg)

    def verify(self) -> None:
        """Raise :class:`FragmentError` if the layout is bad or ``block_digest`` fails."""
        self.check_layout()
        if block_digest(self.header(), self.block) != self.block_digest:
            msg = (
                f"fragment {self.index} of stripe {self.stripe} of {self.checkpoint} "
                "fails its digest"
            )
            raise FragmentError(msg)


def block_digest(header: list[Any], block: bytes) -> bytes:
    """sha256 over the msgpack-encoded header, then the block."""
    hasher = hashlib.sha256(msgpack.packb(header))
    hasher.update(block)
    return hasher.digest()


def check_str(name: str, value: object, error: type[RecoveryError] = FragmentError) -> None:
    """Raise ``error`` unless ``value`` is a str of 1 to :data:`MAX_ID_CHARS` characters."""
    if type(value) is not str or not 1 <= len(value) <= MAX_ID_CHARS:
        msg = f"{name} must be a string of 1 to {MAX_ID_CHARS} characters"
        raise error(msg)


def check_int(
    name: str, value: object, low: int, high: int, error: type[RecoveryError] = FragmentError
) -> None:
    """Raise ``error`` unless ``value`` is an int (not a bool) in ``[low, high]``."""
    if type(value) is not int or not low <= value <= high:
        msg = f"{name} must be an integer in [{low}, {high}], not {value!r}"
        raise error(msg)
