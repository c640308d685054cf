"""Overload at a source: block (backpressure) vs shed newest / oldest, with accounting."""

from __future__ import annotations

import pytest

from agiledart.dataplane import (
    ClosedResourceError,
    CreditWindow,
    OverloadPolicy,
    SourceBuffer,
    WouldBlock,
)


def test_block_counts_each_waiting_tuple_once() -> None:
    buf = SourceBuffer(2, OverloadPolicy.BLOCK)
    assert buf.send_nowait(1)
    assert buf.send_nowait(2)
    for _ in range(3):  # the driver retries the same tuple
        with pytest.raises(WouldBlock):
            buf.send_nowait(3)
    assert buf.receive_nowait() == 1
    assert buf.send_nowait(3)
    with pytest.raises(WouldBlock):
        buf.send_nowait(4)
    s = buf.statistics()
    assert (s.queued, s.accepted, s.shed, s.delayed) == (2, 3, 0, 2)
    assert buf.take(10) == [2, 3]


def test_shed_newest() -> None:
    buf = SourceBuffer(2, OverloadPolicy.SHED_NEWEST)
    assert [buf.send_nowait(i) for i in range(5)] == [True, True, False, False, False]
    assert buf.take(5) == [0, 1]
    s = buf.statistics()
    assert (s.accepted, s.shed, s.delayed) == (2, 3, 0)


def test_shed_oldest() -> None:
    buf = SourceBuffer(2, OverloadPolicy.SHED_OLDEST)
    assert all(buf.send_nowait(i) for i in range(5))
    assert buf.take(5) == [3, 4]
    s = buf.statistics()
    assert (s.accepted, s.shed, s.delayed) == (5, 3, 0)


@pytest.mark.parametrize("policy", list(OverloadPolicy))
def test_accounting_adds_up_against_credit(policy: OverloadPolicy) -> None:
    """A fast source, a credit window that refills slowly: nothing is lost unaccounted."""
    buf = SourceBuffer(8, policy)
    window = CreditWindow(4, limit=4)
    sent: list[int] = []
    produced = 0
    pending: int | None = None
    for tick in range(200):
        for _ in range(3):  # source produces 3 tuples per tick
            if pending is None:
                rec, produced = produced, produced + 1
            else:
                rec = pending
            try:
                buf.send_nowait(rec)
            except WouldBlock:
                pending = rec
                break
            pending = None
        n = min(window.available, len(buf))
        window.consume(n)
        sent += buf.take(n)
        if tick % 2 == 0 and window.available < 4:
            window.grant(min(2, 4 - window.available))  # downstream drains 1 tuple/tick
    s = buf.statistics()
    if policy is OverloadPolicy.BLOCK:
        assert (s.shed, s.delayed > 0) == (0, True)
        assert s.accepted == len(sent) + s.queued == produced - (pending is not None)
        assert sent == list(range(len(sent)))  # order kept, nothing dropped
    elif policy is OverloadPolicy.SHED_NEWEST:
        assert (s.delayed, s.shed > 0) == (0, True)
        assert s.accepted + s.shed == produced
        assert s.accepted == len(sent) + s.queued
    else:
        assert (s.delayed, s.shed > 0) == (0, True)
        assert s.accepted == produced
        assert len(sent) + s.queued + s.shed == produced


def test_close() -> None:
    buf = SourceBuffer(2)
    buf.send_nowait("x")
    buf.close()
    with pytest.raises(ClosedResourceError):
        buf.send_nowait("y")
    assert buf.receive_nowait() == "x"
    with pytest.raises(ClosedResourceError):
        buf.receive_nowait()
    assert SourceBuffer(1).statistics().closed is False
    with pytest.raises(WouldBlock):
        SourceBuffer(1).receive_nowait()
