"""The receiving end of an edge: copies dropped, one credit back per batch processed,
a sender beyond its credit or its own numbering a protocol error."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from agiledart.dataplane import Batch, ProtocolError
from agiledart.dataplane.frames import CreditFrame
from agiledart.runtime.edges import BatchAck, InEdge


class Line:
    peer_name = "sender"

    def __init__(self) -> None:
        self.sent: list[tuple[str, Any]] = []

    async def send(self, type: str, body: Mapping[str, Any] | None = None) -> None:
        self.sent.append((type, body))


def batch(seq: int) -> Batch:
    return Batch("src|sender", seq, [{"n": seq}])


async def test_a_batch_gives_one_credit_back_once_every_consumer_processed_it() -> None:
    edge, line = InEdge(app_id="app", edge="src|sender", credits=4, generation=2), Line()
    assert edge.receive(batch(0))
    ack = BatchAck(edge, line, waiting=2)
    await ack.done()
    assert line.sent == []
    await ack.done()
    assert line.sent == [("credit", CreditFrame("app", "src|sender", 1, 2).to_wire())]


async def test_a_copy_of_a_batch_is_dropped_and_costs_no_credit() -> None:
    edge = InEdge(app_id="app", edge="src|sender", credits=2)
    assert edge.receive(batch(0))
    assert not edge.receive(batch(0))
    assert edge.receive(batch(1))  # the copy did not use up the second credit
    assert edge.duplicates == 1


def test_a_sender_beyond_its_credit_breaks_the_protocol() -> None:
    edge = InEdge(app_id="app", edge="src|sender", credits=2)
    assert edge.receive(batch(0))
    assert edge.receive(batch(1))
    with pytest.raises(ProtocolError):
        edge.receive(batch(2))


def test_a_sender_far_ahead_of_its_own_numbers_breaks_the_protocol() -> None:
    edge = InEdge(app_id="app", edge="src|sender", credits=2)
    assert edge.receive(batch(0))
    with pytest.raises(ProtocolError):
        edge.receive(batch(10_000))


def test_an_edge_takes_the_senders_numbers_from_its_first_batch() -> None:
    """An instance deployed here again while its sender went on: no gap to wait for."""
    edge = InEdge(app_id="app", edge="src|sender", credits=2)
    assert edge.receive(batch(50_000))
    assert not edge.receive(batch(50_000))
    assert edge.receive(batch(50_001))
    assert edge.sequence.statistics().missing == 0
