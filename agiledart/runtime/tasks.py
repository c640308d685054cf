"""An owner for background tasks: every task started through it is held until it ends,
logged if it raised, and cancelled and awaited by :meth:`TaskOwner.aclose`, so that
nothing is left running when its owner shuts down (no fire-and-forget)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger(__name__)

__all__ = ["TaskOwner"]


class TaskOwner:
    """The tasks of one owner (the scheduler). ``spawn`` after ``aclose`` closes the
    coroutine without running it: a component shutting down starts nothing new."""

    __slots__ = ("_closed", "_name", "_tasks")

    def __init__(self, name: str) -> None:
        self._name = name
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False

    def __len__(self) -> int:
        return len(self._tasks)

    @property
    def closed(self) -> bool:
        return self._closed

    def start(self) -> None:
        """(Re)open the owner: tasks may be spawned again."""
        self._closed = False

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any] | None:
        """Run ``coro`` as a task held here; None (and ``coro`` closed) once closed."""
        if self._closed:
            coro.close()
            return None
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("%s: a background task failed", self._name, exc_info=task.exception())

    async def aclose(self) -> None:
        """Cancel every task held here and wait until they all ended."""
        self._closed = True
        while self._tasks:
            tasks = list(self._tasks)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
