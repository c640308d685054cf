"""Property tests: garbage in any chunking gives events or one BadMessage, nothing else;
tampering never delivers anything but an in-order prefix of what was sent."""

from __future__ import annotations

import hashlib
import hmac
import itertools
import random
import struct
from collections.abc import Callable

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agiledart.overlay.auth import ClusterKey
from agiledart.overlay.codec import pack
from agiledart.overlay.errors import BadMessage
from agiledart.overlay.frames import (
    NEED_DATA,
    ConnectionClosed,
    Event,
    FrameConnection,
    HandshakeComplete,
    OneWay,
    Request,
    Role,
    State,
    _FrameMac,
    one_way_message,
    request_message,
)

KEY = ClusterKey.generate(random.Random("test-cluster-key-0123456789"))
Pair = tuple[FrameConnection, FrameConnection]
PairFactory = Callable[..., Pair]
FIXTURE_OK = settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])


def chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


def feed(
    conn: FrameConnection, chunks: list[bytes], eof: bool
) -> tuple[list[Event], BadMessage | None]:
    """Deliver chunks (then EOF); collect events until NEED_DATA, the end, or an error."""
    events: list[Event] = []
    try:
        for chunk in [*chunks, *([b""] if eof else [])]:
            conn.receive_data(chunk)
            while (event := conn.next_event()) is not NEED_DATA:
                events.append(event)
                if isinstance(event, ConnectionClosed):
                    return events, None
    except BadMessage as exc:
        assert conn.state is State.BROKEN
        return events, exc
    return events, None


def framed(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + payload


scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.text(max_size=70),
    st.binary(max_size=40), st.sampled_from(["agiledart/frames", 1, b"n" * 32]),
)  # fmt: skip
hello_like = st.lists(scalars, max_size=5).map(pack)
garbage = st.one_of(
    st.binary(max_size=3000),  # mostly absurd lengths
    st.tuples(st.integers(0, 600), st.binary(max_size=700)).map(
        lambda t: struct.pack(">I", t[0]) + t[1]
    ),  # plausible lengths, random payloads
    st.tuples(hello_like, st.binary(min_size=0, max_size=40)).map(
        lambda t: framed(t[0] + t[1])
    ),  # decodable handshakes of the wrong shape, with or without a proof
    st.lists(hello_like.map(framed), max_size=3).map(b"".join),
)
cuts = st.lists(st.integers(min_value=0, max_value=3000), max_size=12)


@settings(max_examples=400)
@given(data=garbage, cuts=cuts, eof=st.booleans(), role=st.sampled_from(list(Role)))
def test_garbage_before_the_handshake(data: bytes, cuts: list[int], eof: bool, role: Role) -> None:
    conn = FrameConnection(role=role, key=KEY, name="x", max_frame=4096)
    events, error = feed(conn, chunked(data, cuts), eof)
    assert all(isinstance(e, ConnectionClosed) for e in events)  # nothing authentic
    assert error is not None or conn.state is not State.OPEN


@FIXTURE_OK
@given(data=garbage, cuts=cuts, eof=st.booleans(), to_client=st.booleans())
def test_garbage_after_the_handshake(
    pair_factory: PairFactory, data: bytes, cuts: list[int], eof: bool, to_client: bool
) -> None:
    client, server = pair_factory(max_frame=4096)
    events, _ = feed(client if to_client else server, chunked(data, cuts), eof)
    assert all(isinstance(e, ConnectionClosed) for e in events)  # a forged tag never passes


def mutate(wire: bytes, ops: list[tuple[int, int, int]]) -> bytes:
    out = bytearray(wire)
    for kind, where, value in ops:
        at = where % (len(out) + 1)
        if kind == 0 and out:
            out[at % len(out)] ^= value or 1
        elif kind == 1:
            out[at:at] = bytes([value])
        elif kind == 2:
            del out[at : at + 1 + value % 64]
        else:
            out[at:] = out[at:] + out[: value % (len(out) + 1)]  # replay a piece
    return bytes(out)


ops = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 10**6), st.integers(0, 255)), max_size=4)


@given(
    seed=st.integers(0, 2**32),
    sizes=st.lists(st.integers(0, 600), min_size=1, max_size=8),
    ops=ops,
    cuts=cuts,
)
def test_tampered_sessions_deliver_only_an_in_order_prefix(
    seed: int, sizes: list[int], ops: list[tuple[int, int, int]], cuts: list[int]
) -> None:
    rng = random.Random(seed)
    client = FrameConnection(role=Role.CLIENT, key=KEY, name="c", rng=rng)
    server = FrameConnection(role=Role.SERVER, key=KEY, name="s", rng=rng)
    server.receive_data(client.data_to_send())
    server.next_event()
    client.receive_data(server.data_to_send())
    client.next_event()
    sent = [
        one_way_message("b", {"d": rng.randbytes(n)})
        if i % 2
        else request_message("r", i, {"d": rng.randbytes(n)})
        for i, n in enumerate(sizes)
    ]
    wire = b"".join(client.send(m) for m in sent)
    tampered = mutate(wire, ops)

    events, error = feed(server, chunked(tampered, cuts), eof=True)
    got = [e.message for e in events if isinstance(e, Request | OneWay)]
    assert got == sent[: len(got)]
    assert all(
        isinstance(e, HandshakeComplete | Request | OneWay | ConnectionClosed) for e in events
    )
    if tampered == wire:
        assert error is None
        assert got == sent
    elif error is None:  # an untouched session, or one cut cleanly between frames
        assert wire.startswith(tampered)


@given(key=st.binary(min_size=32, max_size=32), seq=st.integers(0, 2**64 - 1), body=st.binary())
def test_the_fast_hmac_is_hmac_sha256(key: bytes, seq: int, body: bytes) -> None:
    expected = hmac.new(key, seq.to_bytes(8, "big") + body, hashlib.sha256).digest()[:16]
    assert _FrameMac(key).tag(seq, body) == expected
    assert _FrameMac(key).tag(seq, memoryview(body)) == expected
