"""The accept policy for connections still in the handshake, as a plain object."""

from __future__ import annotations

import pytest

from agiledart.overlay.admission import HandshakeAdmission


def test_a_full_budget_sheds_the_oldest_and_never_refuses_the_newcomer() -> None:
    policy: HandshakeAdmission[int] = HandshakeAdmission(max_pending=3, max_per_address=10)
    assert [policy.admit(i, f"10.0.0.{i}") for i in range(3)] == [[], [], []]
    assert policy.admit(3, "10.0.0.9") == [0]
    assert 3 in policy
    assert 0 not in policy
    assert len(policy) == 3


def test_silent_connections_are_shed_before_those_that_sent_a_hello() -> None:
    policy: HandshakeAdmission[str] = HandshakeAdmission(max_pending=3, max_per_address=10)
    for conn in ("a", "b", "c"):
        policy.admit(conn, "h1")
    policy.heard("a")
    assert policy.admit("d", "h2") == ["b"]
    policy.heard("c")
    policy.heard("d")
    assert policy.admit("e", "h2") == ["a"]  # every one spoke: the oldest goes


def test_one_address_cannot_hold_more_than_its_share() -> None:
    policy: HandshakeAdmission[int] = HandshakeAdmission(max_pending=100, max_per_address=2)
    assert policy.admit(1, "flood", now=0.0) == []
    assert policy.admit(2, "flood", now=0.1) == []
    assert policy.admit(3, "flood", now=1.0) == [1]
    assert policy.admit(4, "client", now=1.0) == []  # another address is untouched
    assert policy.pending_from("flood") == 2
    assert policy.pending_from("client") == 1


def test_a_burst_from_one_address_is_let_in_while_it_is_young() -> None:
    """Ten peers of one machine connecting at once arrive before any could say hello."""
    policy: HandshakeAdmission[int] = HandshakeAdmission(
        max_pending=100, max_per_address=2, grace_s=0.5
    )
    assert [policy.admit(i, "127.0.0.1", now=0.01 * i) for i in range(10)] == [[]] * 10
    assert policy.admit(10, "127.0.0.1", now=0.6) == [0]  # the oldest has had its chance


def test_a_finished_handshake_frees_its_place() -> None:
    policy: HandshakeAdmission[int] = HandshakeAdmission(max_pending=2, max_per_address=2)
    policy.admit(1, "h")
    policy.admit(2, "h")
    policy.done(1)
    policy.done(1)  # twice is harmless
    assert policy.admit(3, "h") == []
    assert policy.pending_from("h") == 2


def test_a_flood_never_pushes_out_a_client_younger_than_the_budget() -> None:
    """2,000 flooding connections from 50 addresses, one client arriving every 40:
    each client is shed only after max_pending newer arrivals, never at once."""
    policy: HandshakeAdmission[str] = HandshakeAdmission(max_pending=64, max_per_address=8)
    shed_when: dict[str, int] = {}
    for i in range(2000):
        arrivals = [(f"flood-{i}", f"10.1.0.{i % 50}")]
        if i % 40 == 0:
            arrivals.append((f"client-{i}", "10.9.9.9"))
        for conn, address in arrivals:
            for victim in policy.admit(conn, address, now=i / 400):
                shed_when[victim] = i
    clients = [c for c in shed_when if c.startswith("client-")]
    assert all(shed_when[c] - int(c.split("-")[1]) >= 8 for c in clients)


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        HandshakeAdmission(max_pending=0, max_per_address=1)
