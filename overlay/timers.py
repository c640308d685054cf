"""Coarse timers: many deadlines, few event-loop timer handles.

Every RPC arms a timeout and, on the fake network, every datagram a delivery. One
``loop.call_at`` each means a heap of Python-compared ``TimerHandle`` objects as large
as the traffic in flight; with thousands of peers in one process that heap was a
quarter of the run time. :class:`TimerWheel` rounds deadlines up to a granularity and
keeps one loop timer per slot, firing the slot's callbacks in the order they were
added (so runs stay deterministic).
"""

from __future__ import annotations

import asyncio
import math
import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["TimerWheel", "wheel_for"]


class TimerWheel:
    def __init__(self, loop: asyncio.AbstractEventLoop, granularity: float = 0.001) -> None:
        self._loop = weakref.proxy(loop)
        self._g = granularity
        self._slots: dict[int, list[tuple[Callable[..., Any], tuple[Any, ...]]]] = {}

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any) -> None:
        slot = math.ceil((self._loop.time() + max(delay, 0.0)) / self._g)
        entries = self._slots.get(slot)
        if entries is None:
            entries = self._slots[slot] = []
            self._loop.call_at(slot * self._g, self._fire, slot)
        entries.append((callback, args))

    def _fire(self, slot: int) -> None:
        for callback, args in self._slots.pop(slot, ()):
            callback(*args)


_WHEELS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, TimerWheel]
_WHEELS = weakref.WeakKeyDictionary()


def wheel_for(loop: asyncio.AbstractEventLoop) -> TimerWheel:
    """The wheel of ``loop``, shared by everything on it."""
    try:
        wheel = _WHEELS.get(loop)
        if wheel is None:
            wheel = _WHEELS[loop] = TimerWheel(loop)
    except TypeError:  # a loop that cannot be weakly referenced: no sharing
        return TimerWheel(loop)
    return wheel
