"""Cluster keys and datagram authentication: strength, rotation, binding, time."""

from __future__ import annotations

import asyncio
import logging
import random
import tracemalloc
from typing import Any

import pytest

from agiledart.overlay import codec, ids
from agiledart.overlay.auth import DatagramAuth, load_cluster_key
from agiledart.overlay.errors import (
    AuthError,
    ClockSkewError,
    ConfigError,
    KeyMismatch,
    MalformedError,
    ReplayError,
)
from agiledart.overlay.keys import ClusterKey, make_key_text, parse_keys, rotate
from agiledart.overlay.node import OverlayNode

KEY = ClusterKey.generate(random.Random("auth"))
A, B, C = (ids.to_bytes(ids.random_id(random.Random(i))) for i in range(3))


class Clock:
    def __init__(self) -> None:
        self.t = 1_750_000_000.0

    def __call__(self) -> float:
        return self.t


# -- keys -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "material",
    [
        "a-long-pass-phrase-that-anyone-could-guess-0123456789",
        "0123456789abcdef" * 4,  # 64 hex digits, but 8 distinct bytes
        "agiledart-key-v1:" + "A" * 43,  # the format, but all zero bytes
        "agiledart-key-v1:tooshort",
        "",
    ],
)
def test_only_keys_of_full_strength_are_accepted(material: str) -> None:
    with pytest.raises(ConfigError, match="agiledart keygen"):
        ClusterKey.from_material(material)


def test_keygen_keys_and_the_older_hex_keys_are_read() -> None:
    text = make_key_text()
    assert text.startswith("agiledart-key-v1:")
    assert len(parse_keys(f"# a comment\n{text}\n")) == 1
    assert len(parse_keys(random.Random(4).randbytes(32).hex())) == 1
    with pytest.raises(ConfigError, match="one more"):
        parse_keys("\n".join(make_key_text() for _ in range(3)))


def test_a_bad_key_file_is_named_in_the_error(tmp_path: Any) -> None:
    path = tmp_path / "cluster.key"
    path.write_text("correct horse battery staple, long enough\n")
    with pytest.raises(ConfigError, match=f"cluster key file {path}: .*agiledart keygen"):
        load_cluster_key(path, insecure=False, environ={})
    with pytest.raises(ConfigError, match=r"\$AGILEDART_CLUSTER_KEY: "):
        load_cluster_key(None, insecure=False, environ={"AGILEDART_CLUSTER_KEY": "x" * 40})


def test_sub_keys_differ_by_purpose_and_key() -> None:
    other = ClusterKey.generate(random.Random("other"))
    subkeys = {KEY.derive(b"a"), KEY.derive(b"b"), other.derive(b"a")}
    assert len(subkeys) == 3
    assert KEY.key_id != other.key_id
    assert len(KEY.key_id) == 4


def test_a_rotation_in_three_steps() -> None:
    rng = random.Random(9)
    first = make_key_text(rng)
    added, _ = rotate(first, "add", rng)
    old, new = parse_keys(added)
    assert ClusterKey.from_material(added).key_id == ClusterKey.from_material(first).key_id
    promoted, _ = rotate(added, "promote")
    assert parse_keys(promoted) == [new, old]
    retired, _ = rotate(promoted, "retire")
    assert parse_keys(retired) == [new]
    with pytest.raises(ConfigError, match="already under way"):
        rotate(added, "add")
    with pytest.raises(ConfigError, match="--rotate add"):
        rotate(first, "promote")


# -- datagrams --------------------------------------------------------------------------


def test_a_datagram_sealed_for_one_peer_is_refused_by_another() -> None:
    clock = Clock()
    a = DatagramAuth(KEY, local_id=A, clock=clock)
    b = DatagramAuth(KEY, local_id=B, clock=clock)
    c = DatagramAuth(KEY, local_id=C, clock=clock)
    sealed = a.seal(b"to b", to=B, port=4000)
    with pytest.raises(ReplayError, match="another peer"):
        c.open(sealed)
    opened = b.open(sealed)
    assert (opened.payload, opened.to_us, opened.port) == (b"to b", True, 4000)
    tampered = bytearray(sealed)
    tampered[25] ^= 1  # the recipient is under the MAC
    with pytest.raises(AuthError):
        c.open(bytes(tampered))
    anyone = b.open(a.seal(b"hello", port=4000))
    assert not anyone.to_us


def test_a_restarted_peer_refuses_what_was_sealed_before_it_started() -> None:
    clock = Clock()
    a = DatagramAuth(KEY, local_id=A, clock=clock)
    captured = a.seal(b"old", to=B)
    clock.t += 5
    b = DatagramAuth(KEY, local_id=B, clock=clock)  # B restarts: an empty replay cache
    with pytest.raises(ReplayError, match="before this peer started"):
        b.open(captured)
    b.open(a.seal(b"new", to=B))


def test_the_future_allowance_is_small_and_the_refusal_names_the_skew() -> None:
    clock = Clock()
    ahead = Clock()
    a = DatagramAuth(KEY, local_id=A, clock=ahead)
    b = DatagramAuth(KEY, local_id=B, clock=clock)
    ahead.t = clock.t + 4
    b.open(a.seal(b"4 s ahead", to=B))
    ahead.t = clock.t + 10
    with pytest.raises(ClockSkewError, match=r"10\.0 s ahead .*check the clock \(NTP\)") as err:
        b.open(a.seal(b"10 s ahead", to=B))
    assert err.value.skew_s == pytest.approx(10.0)


def test_eviction_never_raises_the_floor_above_recent_honest_traffic() -> None:
    """A full cache once evicted the stamp inserted first: one from a peer 4 s ahead
    raised the floor 4 s into the future and cut everyone else off."""
    clock, fast_clock = Clock(), Clock()
    fast_clock.t += 4
    fast = DatagramAuth(KEY, local_id=A, clock=fast_clock)
    honest = DatagramAuth(KEY, local_id=C, clock=clock)
    b = DatagramAuth(KEY, local_id=B, clock=clock, replay_capacity=3)
    b.open(fast.seal(b"first", to=B))
    for _ in range(5):
        clock.t += 0.01
        b.open(honest.seal(b"honest", to=B))  # every one accepted
    sent = []
    for _ in range(10):
        clock.t += 0.01
        sent.append(honest.seal(b"x", to=B))
        b.open(sent[-1])
    for s in sent:  # and eviction still never re-admits
        with pytest.raises(ReplayError):
            b.open(s)


def test_a_key_that_differs_is_told_apart_from_a_forgery() -> None:
    b = DatagramAuth(KEY, local_id=B)
    stranger = DatagramAuth(ClusterKey.generate(random.Random("stranger")), local_id=A)
    with pytest.raises(KeyMismatch, match="differs from this peer's: check --cluster-key-file"):
        b.open(stranger.seal(b"x", to=B))


def test_during_a_rotation_both_keys_open_and_the_first_seals() -> None:
    old, new = make_key_text(random.Random(1)), make_key_text(random.Random(2))
    clock = Clock()
    during = DatagramAuth(ClusterKey.from_material(f"{new}\n{old}"), local_id=B, clock=clock)
    for text in (old, new):
        sender = DatagramAuth(ClusterKey.from_material(text), local_id=A, clock=clock)
        assert during.open(sender.seal(b"x", to=B)).payload == b"x"
    only_new = DatagramAuth(ClusterKey.from_material(new), local_id=A, clock=clock)
    only_old = DatagramAuth(ClusterKey.from_material(old), local_id=A, clock=clock)
    assert only_new.open(during.seal(b"y", to=A)).payload == b"y"
    with pytest.raises(KeyMismatch):
        only_old.open(during.seal(b"z", to=A))


def test_msgpack_lengths_are_bounded_by_the_message_itself() -> None:
    """Five bytes announcing a 16-million-element array are refused before the
    decoder allocates anything for it (the bound came from max_len, 16 MiB)."""
    tracemalloc.start()
    try:
        with pytest.raises(MalformedError):
            codec.unpack(b"\xdd\x00\xff\xff\xff", max_len=16 * 1024 * 1024)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1024 * 1024


# -- what a peer does with them ------------------------------------------------------


class Wire:
    """A transport that keeps what is sent."""

    def __init__(self) -> None:
        self.sent: list[tuple[bytes, Any]] = []

    def sendto(self, data: bytes, addr: Any = None) -> None:
        self.sent.append((data, addr))

    def close(self) -> None:
        pass


async def test_a_replayed_or_anycast_datagram_never_moves_a_contact() -> None:
    clock = Clock()
    node = OverlayNode(node_id=ids.from_bytes(B), key=KEY, name="b", clock=clock)
    node.attach(Wire(), ("10.0.0.2", 4000))  # type: ignore[arg-type]
    peer = DatagramAuth(KEY, local_id=A, clock=clock)

    def ping(to: bytes, port: int) -> bytes:
        request = codec.encode_request(random.randbytes(8), "ping", [A, "a"])
        return peer.seal(request, to=to, port=port)

    node.protocol.datagram_received(ping(B, 4000), ("10.0.0.1", 4000))
    contact = node.contacts[ids.from_bytes(A)]
    assert contact.address == ("10.0.0.1", 4000)
    # sealed for us, but from another port than the sender listens on (a replay from elsewhere)
    node.protocol.datagram_received(ping(B, 4000), ("10.6.6.6", 4000 + 1))
    # sealed for anyone (a bootstrap ping), from another address
    node.protocol.datagram_received(ping(bytes(20), 6666), ("10.6.6.6", 6666))
    # sealed for another peer
    node.protocol.datagram_received(ping(C, 6666), ("10.6.6.6", 6666))
    assert node.contacts[ids.from_bytes(A)].address == ("10.0.0.1", 4000)
    assert node.stats["unvouched_requests"] == 2
    assert node.stats["rejected_replay"] == 1
    await asyncio.sleep(0)


async def test_clock_skew_is_a_rate_limited_warning_that_says_to_check_the_clock(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="agiledart.overlay")
    clock, ahead = Clock(), Clock()
    ahead.t += 120
    node = OverlayNode(node_id=ids.from_bytes(B), key=KEY, name="b", clock=clock)
    node.attach(Wire(), ("10.0.0.2", 4000))  # type: ignore[arg-type]
    peer = DatagramAuth(KEY, local_id=A, clock=ahead)
    for _ in range(20):
        request = codec.encode_request(random.randbytes(8), "ping", [A, "a"])
        node.protocol.datagram_received(peer.seal(request, to=B, port=4000), ("10.0.0.1", 4000))
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "120.0 s ahead" in warnings[0].getMessage()
    assert "check the clock (NTP)" in warnings[0].getMessage()
    assert node.stats["rejected_clock"] == 20


# -- files ----------------------------------------------------------------------------


@pytest.mark.parametrize("writer", ["atomic_write", "node_id", "checkpoint"])
def test_a_rename_is_made_durable_by_syncing_its_directory(
    writer: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os
    import stat

    from agiledart.overlay.files import atomic_write
    from agiledart.runtime import recovery as checkpoints

    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append("dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    target = tmp_path / "x"
    if writer == "atomic_write":
        atomic_write(target, b"data", mode=0o600)
        assert target.read_bytes() == b"data"
        assert stat.S_IMODE(target.stat().st_mode) == 0o600
    elif writer == "node_id":
        ids.load_or_create_node_id(tmp_path)
    else:
        checkpoints._write_file(target, b"fragment")
    assert synced[-1] == "dir"
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
