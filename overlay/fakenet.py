"""An in-memory datagram network with a virtual clock, for many peers in one process.

The same protocol code runs over it as over real sockets: :class:`FakeNetwork` hands
each peer a transport whose ``sendto`` schedules ``datagram_received`` at the receiver
after a seeded delay, unless the datagram is lost, or the two ends are partitioned, or
the receiver is dead; it may also arrive twice. :class:`VirtualTimeLoop` is an asyncio
event loop whose clock jumps straight to the next timer when nothing is ready (after
``trio.testing.MockClock(autojump_threshold=0)``), so a thousand peers heartbeating
for a virtual minute cost only the CPU of the messages, and every run with the same
seeds is the same run.

Link delays come from a :class:`LinkModel`: by default each address gets a seeded
point in a plane and the one-way delay grows with distance, which keeps the triangle
inequality and so gives proximity routing something real to exploit.
"""

from __future__ import annotations

import asyncio
import math
import random
import selectors
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, TypeVar

from .timers import wheel_for

__all__ = ["FakeNetwork", "FakeTransport", "LinkModel", "VirtualTimeLoop", "run_virtual"]

Address = tuple[str, int]
T = TypeVar("T")
EPOCH = 1_750_000_000.0  # virtual clocks start at a plausible wall-clock time


class _VirtualSelector(selectors.DefaultSelector):
    def __init__(self, loop: VirtualTimeLoop) -> None:
        super().__init__()
        self._vloop = loop

    def select(self, timeout: float | None = None) -> list[Any]:
        ready = super().select(0)
        if ready:
            return ready
        if timeout is None:  # nothing scheduled: only another thread can wake us
            return super().select(None)
        self._vloop.now += timeout
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop on virtual time: sleeping costs nothing, order is deterministic."""

    def __init__(self, start: float = EPOCH) -> None:
        self.now = start
        super().__init__(_VirtualSelector(self))
        self._clock_resolution = 1e-6  # floats near the epoch resolve ~0.25 us

    def time(self) -> float:
        return self.now


def run_virtual(main: Coroutine[Any, Any, T], *, start: float = EPOCH) -> T:
    """``asyncio.run`` on a fresh :class:`VirtualTimeLoop`."""
    with asyncio.Runner(loop_factory=lambda: VirtualTimeLoop(start)) as runner:
        return runner.run(main)


class LinkModel:
    """One-way delay and loss per ordered pair of addresses, seeded."""

    def __init__(
        self,
        *,
        seed: int = 0,
        base_ms: float = 2.0,
        spread_ms: float = 40.0,
        jitter_ms: float = 1.0,
        loss: float = 0.0,
        overrides: dict[tuple[Address, Address], tuple[float, float]] | None = None,
    ) -> None:
        self._seed = seed
        self.base_ms, self.spread_ms, self.jitter_ms, self.loss = (
            base_ms,
            spread_ms,
            jitter_ms,
            loss,
        )
        self._points: dict[Address, tuple[float, float]] = {}
        self.overrides = overrides or {}

    def point(self, addr: Address) -> tuple[float, float]:
        p = self._points.get(addr)
        if p is None:
            r = random.Random(f"{self._seed}/{addr[0]}:{addr[1]}")
            p = self._points[addr] = (r.random(), r.random())
        return p

    def delay_ms(self, src: Address, dst: Address, rng: random.Random) -> float:
        fixed = self.overrides.get((src, dst))
        if fixed is not None:
            return fixed[0]
        (x1, y1), (x2, y2) = self.point(src), self.point(dst)
        return (
            self.base_ms
            + self.spread_ms * math.hypot(x1 - x2, y1 - y2)
            + (rng.random() * self.jitter_ms)
        )

    def loss_rate(self, src: Address, dst: Address) -> float:
        fixed = self.overrides.get((src, dst))
        return self.loss if fixed is None else fixed[1]


class FakeTransport(asyncio.DatagramTransport):
    def __init__(self, net: FakeNetwork, address: Address, protocol: asyncio.DatagramProtocol):
        super().__init__()
        self._net, self.address, self.protocol = net, address, protocol
        self._closed = False

    def sendto(self, data: bytes | bytearray | memoryview, addr: Any = None) -> None:
        if not self._closed:
            self._net.send(self.address, tuple(addr), bytes(data))

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._net.unbind(self.address)

    def is_closing(self) -> bool:
        return self._closed

    def abort(self) -> None:
        self.close()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.address if name == "sockname" else default


class FakeNetwork:
    def __init__(
        self,
        *,
        seed: int = 0,
        links: LinkModel | None = None,
        duplicate: float = 0.0,
    ) -> None:
        self.rng = random.Random(seed)
        self.links = links or LinkModel(seed=seed)
        self.duplicate = duplicate
        self._endpoints: dict[Address, FakeTransport] = {}
        self._group_of: dict[Address, int] = {}
        self.sent = 0
        self.dropped = 0
        self.tap: Callable[[Address, Address, bytes], None] | None = None

    def bind(self, address: Address, protocol: asyncio.DatagramProtocol) -> FakeTransport:
        if address in self._endpoints:
            msg = f"address {address} already bound"
            raise OSError(msg)
        transport = FakeTransport(self, address, protocol)
        self._endpoints[address] = transport
        return transport

    def unbind(self, address: Address) -> None:
        self._endpoints.pop(address, None)

    def partition(self, groups: Iterable[Iterable[Address]]) -> None:
        """Only peers of the same group can talk until :meth:`heal`."""
        self._group_of = {a: i for i, g in enumerate(groups) for a in g}

    def heal(self) -> None:
        self._group_of = {}

    def send(self, src: Address, dst: Address, data: bytes) -> None:
        self.sent += 1
        if self.tap is not None:
            self.tap(src, dst, data)
        if self._group_of and self._group_of.get(src) != self._group_of.get(dst):
            self.dropped += 1
            return
        rng = self.rng
        if rng.random() < self.links.loss_rate(src, dst):
            self.dropped += 1
            return
        copies = 2 if self.duplicate and rng.random() < self.duplicate else 1
        wheel = wheel_for(asyncio.get_running_loop())
        for _ in range(copies):
            delay = self.links.delay_ms(src, dst, rng) / 1000
            wheel.call_later(delay, self._arrive, src, dst, data)

    def _arrive(self, src: Address, dst: Address, data: bytes) -> None:
        endpoint = self._endpoints.get(dst)
        if endpoint is None:
            self.dropped += 1
            return
        endpoint.protocol.datagram_received(data, src)
