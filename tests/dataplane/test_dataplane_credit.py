"""Credit windows never let queued + in-flight exceed the receiver's bound."""

from __future__ import annotations

from collections import deque

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from agiledart.dataplane import (
    CreditGrantor,
    CreditWindow,
    DataPlaneUsageError,
    ProtocolError,
    WouldBlock,
)


def test_window_basics() -> None:
    w = CreditWindow(4)
    assert w.can_send(4)
    assert not w.can_send(5)
    w.consume(3)
    with pytest.raises(WouldBlock):
        w.consume(2)
    w.consume(1)
    w.grant(2)
    s = w.statistics()
    assert (s.available, s.consumed, s.granted, s.blocked) == (2, 4, 2, 1)
    with pytest.raises(ProtocolError):
        w.grant(3)  # would hold 5 > limit 4
    with pytest.raises(ProtocolError):
        w.grant(0)
    with pytest.raises(DataPlaneUsageError):
        w.consume(-1)


def test_grantor_coalesces_and_rejects_overrun() -> None:
    g = CreditGrantor(8, min_grant=4)
    assert g.initial_credits == 8
    assert g.take_grant() == 0
    g.on_receive(8)
    with pytest.raises(ProtocolError):
        g.on_receive(1)
    g.on_drain(3)
    assert g.take_grant() == 0  # 3 < min_grant
    g.on_drain(1)
    assert g.take_grant() == 4
    s = g.statistics()
    assert (s.queued, s.outstanding, s.received, s.granted, s.grants) == (4, 4, 8, 4, 1)
    with pytest.raises(DataPlaneUsageError):
        g.on_drain(5)


class CreditProtocol(RuleBasedStateMachine):
    """Sender, receiver and two FIFO links (data, grants), interleaved at random."""

    @initialize(capacity=st.integers(1, 40), data=st.data())
    def setup(self, capacity: int, data: st.DataObject) -> None:
        self.capacity = capacity
        self.grantor = CreditGrantor(capacity, min_grant=data.draw(st.integers(1, capacity)))
        self.window = CreditWindow(self.grantor.initial_credits)
        self.data_link: deque[int] = deque()
        self.grant_link: deque[int] = deque()
        self.sent = self.delivered = 0

    @rule(n=st.integers(1, 50))
    def send(self, n: int) -> None:
        if self.window.can_send(n):
            self.window.consume(n)
            self.data_link.append(n)
            self.sent += n
        else:
            with pytest.raises(WouldBlock):
                self.window.consume(n)

    @precondition(lambda self: bool(self.data_link))
    @rule()
    def deliver_data(self) -> None:
        n = self.data_link.popleft()
        self.grantor.on_receive(n)  # must never raise: the sender respected its credit

    @rule(n=st.integers(1, 50))
    def drain(self, n: int) -> None:
        k = min(n, self.grantor.queued)
        self.grantor.on_drain(k)
        self.delivered += k

    @rule()
    def grant(self) -> None:
        g = self.grantor.take_grant()
        if g:
            self.grant_link.append(g)

    @precondition(lambda self: bool(self.grant_link))
    @rule()
    def deliver_grant(self) -> None:
        self.window.grant(self.grant_link.popleft())  # must never exceed the limit

    @invariant()
    def bounded(self) -> None:
        queued = self.grantor.queued
        in_flight = sum(self.data_link)
        assert queued + in_flight <= self.capacity
        assert queued + self.grantor.outstanding <= self.capacity
        # conservation: every unit of credit is in exactly one place
        held = self.window.available + sum(self.grant_link)
        assert queued + in_flight + held <= self.capacity
        assert self.delivered + queued + in_flight == self.sent

    @invariant()
    def live(self) -> None:
        # once everything is drained and delivered, the full window can come back
        if not self.data_link and not self.grant_link and self.grantor.queued == 0:
            g = self.grantor
            free = g.capacity - g.queued - g.outstanding
            assert self.window.available + free == self.capacity


TestCreditProtocol = CreditProtocol.TestCase
TestCreditProtocol.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)
