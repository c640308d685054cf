"""Erasure-coded checkpoints: state bytes -> n = m + k fragments, any m rebuild it.

Theory of operation (paper §IV-D, Fig. 6; docs/recovery.md). A
snapshot of B bytes is cut into m data blocks and zfec (Reed-Solomon over GF(2^8))
adds k parity blocks; the n = m + k fragments go to n leaf-set peers, and any m of them
rebuild the state, so up to k holders may be lost. A restoring peer downloads B/m from
each of m holders in parallel instead of B from one.

Stripes. States are cut into stripes of ``m * block_size`` bytes (``block_size``
defaults to 1 MiB) and each stripe is coded on its own, so holder i gets one fragment
*per stripe*, never one fragment concatenating all its blocks: a fragment stays under
:data:`~agiledart.recovery.fragment.MAX_BLOCK_SIZE` and fits one transport frame, and
encoder, holder and decoder each need one stripe in memory, not the whole state. A
state of at most one stripe (most states) is n fragments of stripe 0. Each stripe's
fragments carry the sha256 of the state's prefix through that stripe, so a stripe of
another encoding of the same epoch (an instance that checkpointed an epoch, crashed,
replayed and checkpointed it again) is caught at that stripe, and the last stripe's
digest is the whole state's.

Replication is the degenerate code m = 1: every fragment is a full copy (zfec's output
for m = 1 too, so zfec is skipped), under the same fragments, encode and decode
(:func:`replicate`). It costs (k + 1) B of storage where erasure coding costs (m + k) B/m.

zfec pitfalls handled here, at the one boundary (STYLE.md §2): ``Decoder.decode``
reorders the block list it is given in place, so it only ever gets fresh lists; given
the same block number twice it never returns, so blocks are deduplicated by index;
given a block number >= n it returns garbage silently, so indices are checked first.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import NamedTuple

import zfec

from agiledart.recovery.errors import (
    CodecConfigError,
    FragmentError,
    MixedFragmentsError,
    NotEnoughFragments,
)
from agiledart.recovery.fragment import (
    MAX_BLOCK_SIZE,
    MAX_EPOCH,
    MAX_FRAGMENTS,
    MAX_STRIPES,
    CheckpointId,
    Fragment,
    check_int,
    check_str,
)

DEFAULT_BLOCK_SIZE = 1024 * 1024
"""Bytes per fragment block of a full stripe; a stripe holds ``m * block_size`` bytes."""

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "Fragment",
    "StripeDecoder",
    "StripeEncoder",
    "decode",
    "decode_stream",
    "encode",
    "encode_stream",
    "replicate",
]


@functools.lru_cache(maxsize=32)
def _zfec_encoder(m: int, n: int) -> zfec.Encoder:
    return zfec.Encoder(m, n)


@functools.lru_cache(maxsize=32)
def _zfec_decoder(m: int, n: int) -> zfec.Decoder:
    return zfec.Decoder(m, n)


class StripeEncoder:
    """Encodes a state that arrives in chunks, one stripe at a time (push style).

    :meth:`feed` returns the stripes it completed (each a list of n fragments, index
    order), :meth:`finish` the last one, marked ``last`` (for an empty state, a stripe
    of length 0). A stripe is held back until a byte past it arrives, so that the
    final stripe is always known to be final.
    """

    def __init__(
        self,
        *,
        m: int,
        k: int,
        app: str,
        instance: str,
        epoch: int,
        block_size: int = DEFAULT_BLOCK_SIZE,
    ) -> None:
        check_int("m", m, 1, MAX_FRAGMENTS, CodecConfigError)
        check_int("k", k, 0, MAX_FRAGMENTS - m, CodecConfigError)
        check_int("block_size", block_size, 1, MAX_BLOCK_SIZE, CodecConfigError)
        check_str("app", app, CodecConfigError)
        check_str("instance", instance, CodecConfigError)
        check_int("epoch", epoch, 0, MAX_EPOCH, CodecConfigError)
        self._template = Fragment(
            app=app,
            instance=instance,
            epoch=epoch,
            stripe=0,
            last=False,
            index=0,
            m=m,
            k=k,
            length=0,
            padding=0,
            state_digest=b"",
            block_digest=b"",
            block=b"",
        )
        self._stripe_size = m * block_size
        self._pending = bytearray()
        self._hasher = hashlib.sha256()
        self._stripes = 0
        self._finished = False

    def feed(self, chunk: bytes | bytearray | memoryview) -> list[list[Fragment]]:
        """Add the next bytes of the state; the stripes now complete, maybe none."""
        self._check_open()
        self._pending += chunk
        stripes: list[list[Fragment]] = []
        taken, size = 0, self._stripe_size
        with memoryview(self._pending) as view:
            while len(view) - taken > size:
                stripes.append(self._encode_stripe(view[taken : taken + size], last=False))
                taken += size
        del self._pending[:taken]
        return stripes

    def finish(self) -> list[Fragment]:
        """The end of the state: its last stripe. The encoder is closed afterwards."""
        self._check_open()
        self._finished = True
        with memoryview(self._pending) as view:
            fragments = self._encode_stripe(view, last=True)
        self._pending.clear()
        return fragments

    def _check_open(self) -> None:
        if self._finished:
            msg = "this StripeEncoder has finished; make a new one"
            raise CodecConfigError(msg)

    def _encode_stripe(self, data: memoryview, *, last: bool) -> list[Fragment]:
        m, n = self._template.m, self._template.n
        if self._stripes >= MAX_STRIPES:
            msg = f"a state may have at most {MAX_STRIPES} stripes"
            raise CodecConfigError(msg)
        self._hasher.update(data)
        size = -(-len(data) // m)
        blocks = [bytes(data[i * size : (i + 1) * size]).ljust(size, b"\0") for i in range(m)]
        encoded = blocks * n if m == 1 else _zfec_encoder(m, n).encode(blocks)
        head = replace(
            self._template,
            stripe=self._stripes,
            last=last,
            length=len(data),
            padding=m * size - len(data),
            state_digest=self._hasher.digest(),
        )
        self._stripes += 1
        return [replace(head, index=i, block=block).sealed() for i, block in enumerate(encoded)]


class _Layout(NamedTuple):
    """What the intact fragments of one stripe of one encoding share."""

    m: int
    k: int
    length: int
    padding: int
    last: bool
    state_digest: bytes


class StripeDecoder:
    """Rebuilds a state stripe by stripe (push style), checking the running digest.

    Give :meth:`decode_stripe` the fragments gathered for stripe ``next_stripe``, any
    order, corrupt or duplicate ones included; it returns that stripe's bytes. After
    the stripe marked last, ``done`` is true.
    """

    def __init__(self) -> None:
        self.checkpoint: CheckpointId | None = None
        self.next_stripe = 0
        self.length = 0
        self.done = False
        self._hasher = hashlib.sha256()

    def decode_stripe(self, fragments: Iterable[Fragment]) -> bytes:
        """Stripe ``next_stripe``'s bytes; on :class:`NotEnoughFragments` nothing changes,
        so the caller can fetch more fragments of the stripe and call again."""
        intact, corrupt = _intact(fragments)
        return self._decode_intact(intact, corrupt)

    def _decode_intact(self, intact: list[Fragment], corrupt: int) -> bytes:
        if self.done:
            msg = "the last stripe is decoded already"
            raise CodecConfigError(msg)
        groups: dict[_Layout, dict[int, Fragment]] = {}
        for f in intact:
            self._check_belongs(f)
            layout = _Layout(f.m, f.k, f.length, f.padding, f.last, f.state_digest)
            groups.setdefault(layout, {}).setdefault(f.index, f)
        for layout, by_index in sorted(groups.items(), key=lambda group: -len(group[1])):
            if len(by_index) < layout.m:
                continue
            chosen = sorted(by_index.values(), key=lambda f: f.index)[: layout.m]
            data = _decode_blocks(layout, chosen)
            hasher = self._hasher.copy()
            hasher.update(data)
            if hasher.digest() == layout.state_digest:
                self._hasher = hasher
                self.next_stripe += 1
                self.length += len(data)
                self.done = layout.last
                return data
        raise NotEnoughFragments(self._shortfall(groups, corrupt))

    def _check_belongs(self, fragment: Fragment) -> None:
        if self.checkpoint is None:
            self.checkpoint = fragment.checkpoint
        if fragment.checkpoint != self.checkpoint or fragment.stripe != self.next_stripe:
            msg = (
                f"fragment of stripe {fragment.stripe} of {fragment.checkpoint} given to "
                f"decode stripe {self.next_stripe} of {self.checkpoint}"
            )
            raise MixedFragmentsError(msg)

    def _shortfall(self, groups: dict[_Layout, dict[int, Fragment]], corrupt: int) -> str:
        best = max(groups, key=lambda layout: len(groups[layout]), default=None)
        have = f"{len(groups[best])} of m={best.m}" if best is not None else "none"
        return (
            f"stripe {self.next_stripe} of {self.checkpoint or 'a checkpoint'}: intact "
            f"distinct fragments: {have}; {corrupt} corrupt skipped; "
            f"{max(len(groups) - 1, 0)} other encoding(s) of the epoch seen"
        )


def _intact(fragments: Iterable[Fragment]) -> tuple[list[Fragment], int]:
    """The fragments that pass :meth:`Fragment.verify`, and how many did not."""
    intact: list[Fragment] = []
    corrupt = 0
    for fragment in fragments:
        try:
            fragment.verify()
        except FragmentError:
            corrupt += 1
        else:
            intact.append(fragment)
    return intact, corrupt


def _decode_blocks(layout: _Layout, chosen: list[Fragment]) -> bytes:
    """The stripe's bytes from exactly m intact fragments of distinct indices."""
    if layout.m == 1:
        out = [chosen[0].block]
    else:
        # Fresh lists: zfec reorders the lists it is given in place.
        blocks = [f.block for f in chosen]
        indices = [f.index for f in chosen]
        try:
            out = _zfec_decoder(layout.m, layout.m + layout.k).decode(blocks, indices)
        except zfec.Error as exc:
            msg = f"zfec refused the fragments: {exc}"
            raise FragmentError(msg) from exc
    data = b"".join(out)
    return data[: layout.length] if layout.padding else data


def encode(
    state: bytes | bytearray | memoryview,
    *,
    m: int,
    k: int,
    app: str,
    instance: str,
    epoch: int,
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> list[Fragment]:
    """All fragments of ``state``: n per stripe, stripe by stripe, in index order.

    Holder i stores ``[f for f in fragments if f.index == i]``; for a state of at most
    ``m * block_size`` bytes that is exactly one fragment.
    """
    stripes = encode_stream(
        [state], m=m, k=k, app=app, instance=instance, epoch=epoch, block_size=block_size
    )
    return [fragment for stripe in stripes for fragment in stripe]


def replicate(
    state: bytes | bytearray | memoryview,
    *,
    copies: int,
    app: str,
    instance: str,
    epoch: int,
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> list[Fragment]:
    """``copies`` full copies of ``state`` as fragments (m = 1), for :func:`decode`."""
    check_int("copies", copies, 1, MAX_FRAGMENTS, CodecConfigError)
    return encode(
        state,
        m=1,
        k=copies - 1,
        app=app,
        instance=instance,
        epoch=epoch,
        block_size=block_size,
    )


def encode_stream(
    chunks: Iterable[bytes | bytearray | memoryview],
    *,
    m: int,
    k: int,
    app: str,
    instance: str,
    epoch: int,
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> Iterator[list[Fragment]]:
    """The fragments of the state ``b"".join(chunks)``, one list of n per stripe.

    Arguments are checked now, chunks read lazily: at most one stripe and one chunk
    are held in memory at a time.
    """
    encoder = StripeEncoder(
        m=m, k=k, app=app, instance=instance, epoch=epoch, block_size=block_size
    )
    return _encode_chunks(encoder, chunks)


def _encode_chunks(
    encoder: StripeEncoder, chunks: Iterable[bytes | bytearray | memoryview]
) -> Iterator[list[Fragment]]:
    for chunk in chunks:
        yield from encoder.feed(chunk)
    yield encoder.finish()


def decode(fragments: Iterable[Fragment]) -> bytes:
    """The state rebuilt from any m intact fragments of each of its stripes.

    Fragments may come in any order, with duplicates and corrupt ones (which are
    skipped); every intact one must belong to the same checkpoint, else
    :class:`MixedFragmentsError`. Too few intact: :class:`NotEnoughFragments`.
    Holds the whole state twice at the end; :func:`decode_stream` holds one stripe.
    """
    intact, corrupt = _intact(fragments)
    checkpoints = {fragment.checkpoint for fragment in intact}
    if len(checkpoints) > 1:
        msg = f"fragments of {len(checkpoints)} checkpoints mixed: {sorted(map(str, checkpoints))}"
        raise MixedFragmentsError(msg)
    by_stripe: dict[int, list[Fragment]] = {}
    for fragment in intact:
        by_stripe.setdefault(fragment.stripe, []).append(fragment)
    decoder = StripeDecoder()
    parts = []
    while not decoder.done:
        parts.append(decoder._decode_intact(by_stripe.get(decoder.next_stripe, []), corrupt))
    return b"".join(parts)


def decode_stream(stripes: Iterable[Iterable[Fragment]]) -> Iterator[bytes]:
    """Yield each stripe's bytes from its fragments, stopping after the last stripe.

    Raises :class:`NotEnoughFragments` if ``stripes`` ends before the last stripe.
    """
    decoder = StripeDecoder()
    for fragments in stripes:
        yield decoder.decode_stripe(fragments)
        if decoder.done:
            return
    msg = f"stripes ended after {decoder.next_stripe}, before the last stripe"
    raise NotEnoughFragments(msg)
