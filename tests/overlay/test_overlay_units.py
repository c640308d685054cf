"""Pure pieces of the overlay: routing decision, leaf set, failure detector, auth, codecs."""

from __future__ import annotations

import contextlib
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agiledart.overlay import codec, ids
from agiledart.overlay.auth import ClusterKey, DatagramAuth, load_cluster_key
from agiledart.overlay.envelope import Envelope, Hop
from agiledart.overlay.errors import (
    AuthError,
    BadMessage,
    ClockSkewError,
    ConfigError,
    MalformedError,
    OversizeError,
    ReplayError,
)
from agiledart.overlay.failure import FailureDetector, Health
from agiledart.overlay.leafset import LeafSet, Membership
from agiledart.overlay.routing import Contact, next_hops

KEY = ClusterKey.generate(random.Random("unit-test-cluster-key-0123456789"))


def contact(nid: int, rtt: float | None = None, cap: float = 1.0, failures: int = 0) -> Contact:
    return Contact(nid, "10.0.0.1", 4000, rtt_ms=rtt, capacity=cap, failures=failures)


# -- routing decision -----------------------------------------------------------------------


def test_next_hops_only_strictly_closer_contacts() -> None:
    me, key = 0b1000 << 150, 0b0001 << 150
    farther = contact(0b1100 << 150)
    closer = contact(0b0011 << 150)
    assert next_hops(me, key, [farther, closer]) == [closer]


def test_next_hops_empty_when_self_is_closest() -> None:
    assert next_hops(5, 5, [contact(6), contact(7)]) == []


def test_route_to_a_peers_own_id_prefers_that_peer() -> None:
    rng = random.Random(3)
    me = ids.random_id(rng)
    others = [contact(ids.random_id(rng), rtt=rng.uniform(1, 100)) for _ in range(200)]
    target = others[17]
    target.rtt_ms = 500.0  # even when slow: nothing else shares 160 bits
    assert next_hops(me, target.node_id, others)[0] is target


def test_proximity_breaks_ties_within_the_slack() -> None:
    key = 0
    me = 1 << 159
    a = contact(0b101 << 140, rtt=80.0)  # prefix bits with key: 17
    b = contact(0b111 << 140, rtt=5.0)  # also 17
    c = contact(0b1 << 155, rtt=1.0)  # only 4 bits: far outside the slack
    order = next_hops(me, key, [a, b, c], slack_bits=1)
    assert order == [b, a, c]


def test_spare_capacity_counts_in_the_cost() -> None:
    key, me = 0, 1 << 159
    busy = contact(0b110 << 140, rtt=10.0, cap=0.0)
    idle = contact(0b111 << 140, rtt=12.0, cap=1.0)
    assert next_hops(me, key, [busy, idle])[0] is idle


def test_suspects_are_tried_last_and_excluded_ids_never() -> None:
    key, me = 0, 1 << 159
    best = contact(1, failures=2)
    ok = contact(1 << 100)
    gone = contact(2)
    order = next_hops(me, key, [best, ok, gone], exclude={gone.node_id})
    assert order == [ok, best]


def test_exact_within_leaf_radius_goes_to_the_closest() -> None:
    key = 0
    me = 1 << 20
    near_slow = contact(3, rtt=500.0)
    other = contact(2 << 10, rtt=1.0)
    assert next_hops(me, key, [other, near_slow], exact_within=1 << 30)[0] is near_slow


@given(
    st.integers(0, 2**160 - 1),
    st.integers(0, 2**160 - 1),
    st.lists(st.integers(0, 2**160 - 1), max_size=40),
)
@settings(max_examples=200, deadline=None)
def test_every_candidate_makes_progress(me: int, key: int, others: list[int]) -> None:
    hops = next_hops(me, key, [contact(o) for o in others])
    assert all((h.node_id ^ key) < (me ^ key) for h in hops)
    assert sorted(h.node_id for h in hops) == sorted(o for o in others if (o ^ key) < (me ^ key))


# -- leaf set -------------------------------------------------------------------------------


def test_leaf_set_keeps_the_l_closest_and_reports_events() -> None:
    ls = LeafSet(0, size=2)
    assert [e.kind for e in ls.offer(contact(8))] == [Membership.JOINED]
    ls.offer(contact(4))
    events = ls.offer(contact(1))
    assert [(e.kind, e.contact.node_id) for e in events] == [
        (Membership.JOINED, 1),
        (Membership.LEFT, 8),
    ]
    assert [c.node_id for c in ls.members()] == [1, 4]
    assert ls.offer(contact(100)) == []
    assert [e.kind for e in ls.remove(4, dead=True)] == [Membership.DEAD]
    assert ls.remove(4, dead=True) == []


# -- failure detector -----------------------------------------------------------------------


def test_one_lost_heartbeat_is_not_a_death() -> None:
    fd = FailureDetector(misses_to_dead=3)
    fd.watch(7)
    assert fd.on_miss(7) is Health.SUSPECT
    assert fd.on_ack(7) is Health.ALIVE
    assert fd.on_miss(7) is Health.SUSPECT
    assert fd.on_miss(7) is Health.SUSPECT
    assert fd.on_miss(7) is Health.DEAD
    assert fd.health(7) is None  # forgotten: DEAD is reported once
    assert fd.on_miss(7) is None


def test_failure_detector_refuses_a_single_miss_threshold() -> None:
    with pytest.raises(ValueError, match="one lost datagram"):
        FailureDetector(misses_to_dead=1)


# -- auth -----------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t


def test_datagram_round_trip_and_tampering() -> None:
    clock = Clock()
    a = DatagramAuth(KEY, clock=clock, rng=random.Random(1))
    b = DatagramAuth(KEY, clock=clock, rng=random.Random(2))
    sealed = a.seal(b"hello")
    assert b.open(sealed).payload == b"hello"
    tampered = bytearray(a.seal(b"hello"))
    tampered[20] ^= 1
    with pytest.raises(AuthError):
        b.open(bytes(tampered))
    other = DatagramAuth(
        ClusterKey.generate(random.Random("another-cluster-key-xxxxxxxx")), clock=clock
    )
    with pytest.raises(AuthError):
        other.open(a.seal(b"x"))


def test_replays_and_stale_datagrams_are_refused() -> None:
    clock = Clock()
    a = DatagramAuth(KEY, clock=clock)
    b = DatagramAuth(KEY, clock=clock, window_s=30)
    sealed = a.seal(b"once")
    b.open(sealed)
    with pytest.raises(ReplayError):
        b.open(sealed)
    old = a.seal(b"old")
    clock.t += 31
    with pytest.raises(ClockSkewError, match=r"31\.0 s behind"):
        b.open(old)


def test_replay_cache_eviction_never_readmits() -> None:
    clock = Clock()
    a = DatagramAuth(KEY, clock=clock)
    b = DatagramAuth(KEY, clock=clock, replay_capacity=4)
    sealed = []
    for _ in range(10):
        clock.t += 0.01
        sealed.append(a.seal(b"x"))
    for s in sealed:
        b.open(s)
    for s in sealed:
        with pytest.raises(ReplayError):
            b.open(s)


def test_oversize_datagrams_are_refused() -> None:
    a = DatagramAuth(KEY)
    with pytest.raises(OversizeError):
        a.seal(b"x" * 9000)
    with pytest.raises(OversizeError):
        a.open(b"x" * 9000)


def test_missing_key_refuses_and_says_how_to_make_one(tmp_path: object) -> None:
    with pytest.raises(ConfigError, match="keygen"):
        load_cluster_key(None, insecure=False, environ={})
    assert load_cluster_key(None, insecure=True, environ={}).insecure
    with pytest.raises(ConfigError, match="agiledart keygen"):
        load_cluster_key(None, insecure=False, environ={"AGILEDART_CLUSTER_KEY": "short"})


@given(st.binary(max_size=600))
@settings(max_examples=300, deadline=None)
def test_any_garbage_datagram_is_one_bad_message(data: bytes) -> None:
    with pytest.raises(BadMessage):
        DatagramAuth(KEY).open(data)


# -- codecs ---------------------------------------------------------------------------------


@given(st.binary(max_size=400))
@settings(max_examples=300, deadline=None)
def test_rpc_decoder_garbage_is_malformed_or_parsed(data: bytes) -> None:
    try:
        msg = codec.decode_rpc(data, max_len=8192)
    except BadMessage:
        return
    assert isinstance(msg, codec.Request | codec.Response)


def test_rpc_round_trip() -> None:
    req = codec.decode_rpc(codec.encode_request(b"12345678", "ping", [b"x"]), max_len=8192)
    assert req == codec.Request(b"12345678", "ping", [b"x"])
    with pytest.raises(MalformedError):
        codec.decode_rpc(codec.pack([0, b"short", "ping", []]), max_len=8192)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.text(max_size=20)
    | st.binary(max_size=30),
    lambda inner: st.lists(inner, max_size=8),
    max_leaves=30,
)


@given(json_values)
@settings(max_examples=300, deadline=None)
def test_envelope_decoder_rejects_wrong_shapes_with_malformed(value: object) -> None:
    with contextlib.suppress(MalformedError):
        Envelope.from_wire(value)


def test_envelope_round_trip() -> None:
    origin = Hop(5, "10.0.0.1", 4000, "a", None, 1.0)
    env = Envelope(b"abcdefgh", 99, "join", {"app": "x"}, origin).with_hop(origin)
    assert Envelope.from_wire(codec.unpack(codec.pack(env.wire()), max_len=8192)) == env


def test_node_id_is_stable_across_restarts(tmp_path: object) -> None:
    from pathlib import Path

    d = Path(str(tmp_path))
    first = ids.load_or_create_node_id(d)
    assert ids.load_or_create_node_id(d) == first
    (d / "node_id").write_text("not hex\n")
    with pytest.raises(ConfigError):
        ids.load_or_create_node_id(d)
