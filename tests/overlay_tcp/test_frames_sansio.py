"""The sans-IO frame protocol: handshake, tags, limits, shapes, states."""

from __future__ import annotations

import hashlib
import hmac
import random
import struct
import types
from collections.abc import Callable
from typing import Any

import pytest

from agiledart.overlay import frames
from agiledart.overlay.auth import ClusterKey
from agiledart.overlay.codec import pack, unpack
from agiledart.overlay.errors import AuthError, KeyMismatch, MalformedError, OversizeError
from agiledart.overlay.frames import (
    MAX_HANDSHAKE,
    NEED_DATA,
    TAG,
    TRANSITIONS,
    ConnectionClosed,
    Event,
    FrameConnection,
    FrameStateError,
    HandshakeComplete,
    OneWay,
    Reply,
    Request,
    Role,
    State,
    error_reply,
    ok_reply,
    one_way_message,
    request_message,
)
from agiledart.overlay.keys import make_key_text

KEY = ClusterKey.generate(random.Random("test-cluster-key-0123456789"))
OTHER_KEY = ClusterKey.generate(random.Random("some-other-cluster-key-987"))
Pair = tuple[FrameConnection, FrameConnection]
PairFactory = Callable[..., Pair]


def drain(conn: FrameConnection) -> list[Event]:
    events: list[Event] = []
    while (event := conn.next_event()) is not NEED_DATA:
        events.append(event)
        if isinstance(event, ConnectionClosed):
            break
    return events


def deliver(data: bytes, to: FrameConnection) -> list[Event]:
    to.receive_data(data)
    return drain(to)


def split_frames(wire: bytes) -> list[bytes]:
    out, pos = [], 0
    while pos < len(wire):
        (size,) = struct.unpack_from(">I", wire, pos)
        out.append(wire[pos : pos + 4 + size])
        pos += 4 + size
    return out


# -- handshake and happy paths ----------------------------------------------------------


def test_messages_flow_both_ways_after_the_handshake(pair: Pair) -> None:
    client, server = pair
    assert client.state is State.OPEN
    assert server.state is State.OPEN
    assert (client.peer_name, server.peer_name) == ("bob", "alice")

    events = deliver(
        client.send(request_message("ring", 7, {"x": [1, 2]}))
        + client.send(one_way_message("batch", {"rows": b"\x00" * 300})),
        server,
    )
    assert events == [
        Request("ring", 7, {"t": "ring", "id": 7, "x": [1, 2]}),
        OneWay("batch", {"t": "batch", "id": None, "rows": b"\x00" * 300}),
    ]
    replies = deliver(
        server.send(ok_reply(7, {"peers": 3})) + server.send(error_reply(8, "E", "m")), client
    )
    assert replies == [Reply(7, True, {"peers": 3}, "", ""), Reply(8, False, None, "E", "m")]
    assert (client.frames_out, server.frames_in, server.frames_out, client.frames_in) == (
        2,
        2,
        2,
        2,
    )


def test_bytes_arriving_one_at_a_time() -> None:
    client = FrameConnection(role=Role.CLIENT, key=KEY, name="c", rng=random.Random(3))
    server = FrameConnection(role=Role.SERVER, key=KEY, name="s", rng=random.Random(4))
    got: list[Event] = []

    def trickle(data: bytes, to: FrameConnection) -> list[Event]:
        events = []
        for i in range(len(data)):
            events += deliver(data[i : i + 1], to)
        return events

    assert trickle(client.data_to_send(), server) == []
    assert trickle(server.data_to_send(), client) == [HandshakeComplete("s")]
    wire = client.send(request_message("a", 1, None)) + client.send(request_message("b", 2, None))
    got = trickle(wire, server)
    assert [type(e) for e in got] == [HandshakeComplete, Request, Request]
    assert [e.type for e in got if isinstance(e, Request)] == ["a", "b"]


def test_first_frame_carries_the_pending_proof() -> None:
    client = FrameConnection(role=Role.CLIENT, key=KEY, name="c")
    server = FrameConnection(role=Role.SERVER, key=KEY, name="s")
    server.receive_data(client.data_to_send())
    assert server.next_event() is NEED_DATA
    client.receive_data(server.data_to_send())
    assert client.next_event() == HandshakeComplete("s")
    # no data_to_send(): send() must put the proof in front of the frame itself
    events = deliver(client.send(request_message("x", 0, None)), server)
    assert [type(e) for e in events] == [HandshakeComplete, Request]


def test_wire_format_matches_the_documented_derivation() -> None:
    """Recompute proofs, keys and the first tag from the module docstring's formulas."""
    client = FrameConnection(role=Role.CLIENT, key=KEY, name="alice")
    server = FrameConnection(role=Role.SERVER, key=KEY, name="bob")
    hello_c_wire = client.data_to_send()
    server.receive_data(hello_c_wire)
    server.next_event()
    hello_s_wire = server.data_to_send()
    client.receive_data(hello_s_wire)
    client.next_event()
    proof_wire = client.data_to_send()

    hello_c, hello_s = hello_c_wire[4:], hello_s_wire[4:]
    assert struct.unpack(">I", hello_c_wire[:4])[0] == len(hello_c)
    magic, version, nonce_c, name, key_id = unpack(hello_c, max_len=MAX_HANDSHAKE)
    assert (magic, version, len(nonce_c), name) == ("agiledart/frames", 2, 32, "alice")
    # HKDF-Expand (RFC 5869) of one block: T(1) = HMAC(PRK, info | 0x01)
    assert key_id == hmac.new(KEY.secret, b"agiledart key id\x01", hashlib.sha256).digest()[:4]
    core, proof_s = hello_s[:-32], hello_s[-32:]
    assert unpack(core, max_len=MAX_HANDSHAKE)[2] == "bob"

    k = hmac.new(KEY.secret, b"agiledart/frames/v2\x01", hashlib.sha256).digest()
    framed = struct.pack(">I", len(hello_c)) + hello_c + struct.pack(">I", len(core)) + core
    th = hashlib.sha256(framed).digest()

    def mac(label: bytes) -> bytes:
        return hmac.new(k, label + b"\0" + th, hashlib.sha256).digest()

    assert proof_s == mac(b"server proof")
    assert proof_wire == struct.pack(">I", 32) + mac(b"client proof")
    wire = client.send({"t": "x", "id": None})
    size = struct.unpack(">I", wire[:4])[0]
    body, tag = wire[4:-TAG], wire[-TAG:]
    assert size == len(body) + TAG
    seq0 = (0).to_bytes(8, "big")
    assert tag == hmac.new(mac(b"frames c2s"), seq0 + body, hashlib.sha256).digest()[:16]


# -- authentication ---------------------------------------------------------------------


def test_a_key_that_differs_is_named_on_both_sides_and_no_proof_is_shown() -> None:
    client = FrameConnection(role=Role.CLIENT, key=OTHER_KEY, name="c")
    server = FrameConnection(role=Role.SERVER, key=KEY, name="s")
    with pytest.raises(KeyMismatch, match="client 'c': the cluster key differs"):
        deliver(client.data_to_send(), server)
    refusal = server.data_to_send()
    assert len(refusal) < 4 + 32  # no server proof for a keyless client to test guesses on
    with pytest.raises(KeyMismatch, match="cluster key differs from this peer's: check"):
        deliver(refusal, client)
    assert client.data_to_send() == b""
    assert (client.state, server.state) == (State.BROKEN, State.BROKEN)


def test_both_keys_of_a_rotation_are_accepted_and_the_first_seals() -> None:
    old, new = make_key_text(random.Random(1)), make_key_text(random.Random(2))
    only_old, only_new = ClusterKey.from_material(old), ClusterKey.from_material(new)
    promoted = ClusterKey.from_material(f"{new}\n{old}\n")  # seals with new, accepts old
    assert promoted.key_id == only_new.key_id
    cases = [
        (only_old, promoted, True),
        (only_new, promoted, True),
        (promoted, only_new, True),
        (promoted, only_old, False),  # a peer not yet given the new key
    ]
    for client_key, server_key, opens in cases:
        client = FrameConnection(role=Role.CLIENT, key=client_key, name="c")
        server = FrameConnection(role=Role.SERVER, key=server_key, name="s")
        if not opens:
            with pytest.raises(KeyMismatch):
                deliver(client.data_to_send(), server)
            continue
        deliver(client.data_to_send(), server)
        deliver(server.data_to_send(), client)
        deliver(client.data_to_send(), server)
        assert (client.state, server.state) == (State.OPEN, State.OPEN)


def test_client_rejects_a_server_that_cannot_prove_the_key() -> None:
    client = FrameConnection(role=Role.CLIENT, key=KEY, name="c")
    server = FrameConnection(role=Role.SERVER, key=KEY, name="s")
    deliver(client.data_to_send(), server)
    forged = bytearray(server.data_to_send())
    forged[-1] ^= 1  # a server without the key can only guess its proof
    with pytest.raises(AuthError, match="server failed to prove"):
        deliver(bytes(forged), client)
    assert client.state is State.BROKEN
    assert client.data_to_send() == b""  # no proof is ever sent to an impostor
    with pytest.raises(FrameStateError):
        client.next_event()


def test_server_rejects_a_client_that_names_the_key_but_cannot_prove_it() -> None:
    client = FrameConnection(role=Role.CLIENT, key=KEY, name="c")  # the key id is public
    server = FrameConnection(role=Role.SERVER, key=KEY, name="s")
    deliver(client.data_to_send(), server)
    with pytest.raises(AuthError, match="client failed to prove"):
        deliver(struct.pack(">I", 32) + random.Random(3).randbytes(32), server)
    assert server.state is State.BROKEN


def test_a_recorded_session_replayed_to_a_new_server_is_refused() -> None:
    client = FrameConnection(role=Role.CLIENT, key=KEY, name="c", rng=random.Random(5))
    server = FrameConnection(role=Role.SERVER, key=KEY, name="s", rng=random.Random(6))
    recorded = client.data_to_send()
    deliver(recorded, server)
    deliver(server.data_to_send(), client)
    tail = client.send(request_message("stop", 1, {"app": "x"}))  # proof + frame
    recorded += tail
    assert [type(e) for e in deliver(tail, server)] == [HandshakeComplete, Request]

    fresh = FrameConnection(role=Role.SERVER, key=KEY, name="s", rng=random.Random(7))
    fresh.receive_data(recorded)
    with pytest.raises(AuthError):
        drain(fresh)  # the proof was for another server nonce; no Request escapes


def test_a_replayed_frame_is_refused(pair: Pair) -> None:
    client, server = pair
    frame = client.send(request_message("stop", 1, None))
    assert len(deliver(frame, server)) == 1
    with pytest.raises(AuthError):
        deliver(frame, server)


def test_reordered_or_dropped_frames_are_refused(pair_factory: PairFactory) -> None:
    client, server = pair_factory()
    first = client.send(one_way_message("a", None))
    second = client.send(one_way_message("b", None))
    with pytest.raises(AuthError):
        deliver(second + first, server)
    client, server = pair_factory()
    client.send(one_way_message("a", None))  # lost on the way
    with pytest.raises(AuthError):
        deliver(client.send(one_way_message("b", None)), server)


def test_a_frame_spliced_from_another_session_is_refused(pair_factory: PairFactory) -> None:
    client_a, _ = pair_factory(seed=10)
    _, server_b = pair_factory(seed=20)
    spliced = client_a.send(request_message("stop", 1, None))  # same key, same seq 0
    with pytest.raises(AuthError):
        deliver(spliced, server_b)


def test_a_frame_reflected_to_its_sender_is_refused(pair: Pair) -> None:
    client, _server = pair
    with pytest.raises(AuthError):
        deliver(client.send(one_way_message("a", None)), client)


@pytest.mark.parametrize("offset", [4, 5, 8, -17, -16, -1])
def test_any_flipped_bit_in_body_or_tag_is_refused(pair: Pair, offset: int) -> None:
    client, server = pair
    wire = bytearray(client.send(request_message("ring", 3, {"a": "bcdefgh"})))
    wire[offset] ^= 0x01
    with pytest.raises(AuthError):
        deliver(bytes(wire), server)


def test_insecure_mode_still_authenticates_frames(pair_factory: PairFactory) -> None:
    client, server = pair_factory(key=ClusterKey.for_insecure_mode())
    events = deliver(client.send(one_way_message("a", None)), server)
    assert events == [OneWay("a", {"t": "a", "id": None})]
    with pytest.raises(AuthError):
        deliver(client.send(one_way_message("a", None))[:-1] + b"?", server)


def test_unsupported_version_is_refused() -> None:
    server = FrameConnection(role=Role.SERVER, key=KEY, name="s")
    hello = pack(["agiledart/frames", 2, b"n" * 32, "c"])
    with pytest.raises(AuthError, match="version 2"):
        deliver(struct.pack(">I", len(hello)) + hello, server)


def test_not_a_frames_client_is_refused() -> None:
    server = FrameConnection(role=Role.SERVER, key=KEY, name="s")
    hello = pack(["GET / HTTP/1.1", 1, b"n" * 32, "c"])
    with pytest.raises(AuthError):
        deliver(struct.pack(">I", len(hello)) + hello, server)


# -- limits and truncation --------------------------------------------------------------


def test_oversize_length_is_refused_from_the_header_alone(pair_factory: PairFactory) -> None:
    _, server = pair_factory(max_frame=1000)
    server.receive_data(struct.pack(">I", 1000 + TAG + 1))  # four bytes, nothing more
    with pytest.raises(OversizeError):
        server.next_event()
    fresh = FrameConnection(role=Role.SERVER, key=KEY, name="s")
    fresh.receive_data(struct.pack(">I", MAX_HANDSHAKE + 1))
    with pytest.raises(OversizeError):
        fresh.next_event()


def test_a_huge_header_is_refused_without_waiting_for_its_body() -> None:
    server = FrameConnection(role=Role.SERVER, key=KEY, name="s")
    with pytest.raises(OversizeError):
        deliver(b"\xff\xff\xff\xff", server)


def test_frames_up_to_the_limit_pass_and_larger_ones_are_not_sent(
    pair_factory: PairFactory,
) -> None:
    client, server = pair_factory(max_frame=2000)
    body = {"t": "b", "id": None, "d": b""}
    overhead = len(pack(body))
    exact = {**body, "d": b"x" * (2000 - overhead - 1)}  # bin 8 -> bin 16 header: +1 byte
    assert len(pack(exact)) == 2000
    assert deliver(client.send(exact), server) == [OneWay("b", exact)]
    with pytest.raises(OversizeError):
        client.send({**exact, "d": exact["d"] + b"x"})
    assert deliver(client.send(body), server) == [OneWay("b", body)]  # still in sync


def test_eof_cleanly_between_frames(pair: Pair) -> None:
    client, server = pair
    server.receive_data(client.send(one_way_message("a", None)))
    server.receive_data(b"")
    assert drain(server) == [OneWay("a", {"t": "a", "id": None}), ConnectionClosed()]
    assert server.state is State.CLOSED
    with pytest.raises(FrameStateError):
        server.receive_data(b"more")


@pytest.mark.parametrize("keep", [1, 3, 4, 10, -1])
def test_eof_inside_a_frame_is_a_truncated_frame(pair: Pair, keep: int) -> None:
    client, server = pair
    wire = client.send(request_message("ring", 1, {"pad": "x" * 20}))
    server.receive_data(wire[:keep])
    assert server.next_event() is NEED_DATA
    server.receive_data(b"")
    with pytest.raises(MalformedError, match="closed inside"):
        server.next_event()


def test_eof_during_the_handshake() -> None:
    server = FrameConnection(role=Role.SERVER, key=KEY, name="s")
    assert deliver(b"", server) == [ConnectionClosed()]
    client = FrameConnection(role=Role.CLIENT, key=KEY, name="c")
    client.receive_data(b"\x00\x00")
    client.receive_data(b"")
    with pytest.raises(MalformedError):
        client.next_event()


def test_a_frame_shorter_than_its_tag_is_malformed(pair: Pair) -> None:
    _, server = pair
    with pytest.raises(MalformedError):
        deliver(struct.pack(">I", TAG) + b"t" * TAG, server)


# -- shapes -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "message",
    [
        [1, 2, 3],
        "text",
        {"id": 1},
        {"t": 5},
        {"t": ""},
        {"t": "x" * 65},
        {"t": "x", "id": -1},
        {"t": "x", "id": True},
        {"t": "x", "id": 1.5},
        {"t": "reply", "id": None, "ok": True},
        {"t": "reply", "id": 1},
        {"t": "reply", "id": 1, "ok": False},
        {"t": "reply", "id": 1, "ok": False, "error": "no"},
        {"t": "reply", "id": 1, "ok": False, "error": {"type": "E"}},
    ],
)
def test_authentic_frames_of_the_wrong_shape_are_malformed(pair: Pair, message: Any) -> None:
    client, server = pair
    with pytest.raises(MalformedError):
        deliver(client.send(message), server)
    assert server.state is State.BROKEN


def test_an_authentic_but_undecodable_body_is_malformed(pair: Pair) -> None:
    client, server = pair
    client._packer = types.SimpleNamespace(pack=lambda m: b"\xc1\xc1 not msgpack")  # type: ignore[assignment]
    with pytest.raises(MalformedError):
        deliver(client.send({}), server)


def test_envelope_builders_refuse_reserved_keys() -> None:
    with pytest.raises(ValueError, match="envelope keys"):
        request_message("x", 1, {"t": "y"})
    with pytest.raises(ValueError, match="envelope keys"):
        one_way_message("x", {"id": 3})


# -- states ------------------------------------------------------------------------------


def test_no_frames_before_the_handshake_completes() -> None:
    client = FrameConnection(role=Role.CLIENT, key=KEY, name="c")
    server = FrameConnection(role=Role.SERVER, key=KEY, name="s")
    with pytest.raises(FrameStateError):
        client.send({"t": "x", "id": None})
    deliver(client.data_to_send(), server)
    assert server.state is State.AWAIT_PROOF
    with pytest.raises(FrameStateError):
        server.send({"t": "x", "id": None})


def test_the_transition_table() -> None:
    live = [State.AWAIT_HELLO, State.AWAIT_PROOF, State.AWAIT_SERVER_HELLO, State.OPEN]
    for state in live:
        assert TRANSITIONS[(state, frames.Input.EOF)] is State.CLOSED
        assert TRANSITIONS[(state, frames.Input.ERROR)] is State.BROKEN
    for state in (State.CLOSED, State.BROKEN):
        assert not any(s is state for s, _ in TRANSITIONS)  # terminal
    conn = FrameConnection(role=Role.SERVER, key=KEY, name="s")
    with pytest.raises(FrameStateError, match="illegal transition"):
        conn._advance(frames.Input.SERVER_HELLO)  # a server never receives a server hello


def test_bad_local_arguments() -> None:
    with pytest.raises(ValueError, match="name"):
        FrameConnection(role=Role.CLIENT, key=KEY, name="n" * 65)
    with pytest.raises(ValueError, match="max_frame"):
        FrameConnection(role=Role.CLIENT, key=KEY, name="n", max_frame=0)
