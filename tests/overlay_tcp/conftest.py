"""Shared pieces of the frame tests: keys and a handshaken sans-IO pair."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from agiledart.overlay.auth import ClusterKey
from agiledart.overlay.frames import (
    DEFAULT_MAX_FRAME,
    NEED_DATA,
    FrameConnection,
    HandshakeComplete,
    Role,
)

KEY = ClusterKey.generate(random.Random("test-cluster-key-0123456789"))

Pair = tuple[FrameConnection, FrameConnection]


def open_pair(*, seed: int = 1, max_frame: int = DEFAULT_MAX_FRAME, key: ClusterKey = KEY) -> Pair:
    """A client ("alice") and a server ("bob") that completed the handshake."""
    client = FrameConnection(
        role=Role.CLIENT, key=key, name="alice", max_frame=max_frame, rng=random.Random(seed)
    )
    server = FrameConnection(
        role=Role.SERVER, key=key, name="bob", max_frame=max_frame, rng=random.Random(seed + 1)
    )
    server.receive_data(client.data_to_send())
    assert server.next_event() is NEED_DATA
    client.receive_data(server.data_to_send())
    assert client.next_event() == HandshakeComplete("bob")
    server.receive_data(client.data_to_send())
    assert server.next_event() == HandshakeComplete("alice")
    return client, server


@pytest.fixture
def pair_factory() -> Callable[..., Pair]:
    return open_pair


@pytest.fixture
def pair() -> Pair:
    return open_pair()
