"""The peer's side of one worker process: start it, send requests, await replies.

A :class:`WorkerProcess` owns a child ``python -m agiledart.runtime.execution.worker``
and a socketpair to it. Requests are pipelined: :meth:`call` writes the request and
waits for its reply; replies come back in request order, matched by a FIFO of futures
that one reader task (a child of the peer's task group) resolves. When the process
dies every waiting call fails with :class:`WorkerDied`, and so does every later call.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import socket
import subprocess
import sys
import time
from typing import Any

from agiledart.app.errors import ExecutionError
from agiledart.runtime.execution.wire import WorkerGone, pack, read_frame

log = logging.getLogger(__name__)

__all__ = ["TurnFailed", "WorkerDied", "WorkerProcess"]


class WorkerDied(ExecutionError):
    """The worker process exited or was killed."""


class TurnFailed(ExecutionError):
    """The worker ran the request and it raised (user code, a bad request)."""


class WorkerProcess:
    def __init__(self, name: str) -> None:
        self.name = name
        self._proc: subprocess.Popen[bytes] | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._waiting: collections.deque[asyncio.Future[tuple[Any, ...]]] = collections.deque()
        self._dead: str | None = None
        self.turns = 0
        self.busy_s = 0.0  #: seconds spent running turns
        self.started = time.monotonic()

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def age_s(self) -> float:
        return max(1e-9, time.monotonic() - self.started)

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._dead is None

    @property
    def outstanding(self) -> int:
        return len(self._waiting)

    async def start(self, group: asyncio.TaskGroup) -> None:
        ours, theirs = socket.socketpair()
        try:
            self._proc = subprocess.Popen(  # noqa: ASYNC220 -- fork+exec, no wait
                [
                    sys.executable,
                    "-m",
                    "agiledart.runtime.execution.worker",
                    "--fd",
                    str(theirs.fileno()),
                ],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                close_fds=True,
            )
        except OSError as exc:
            ours.close()
            msg = f"cannot start worker process {self.name}: {exc}"
            raise WorkerDied(msg) from exc
        finally:
            theirs.close()
        reader, self._writer = await asyncio.open_unix_connection(sock=ours)
        group.create_task(self._read(reader), name=f"worker {self.name}")

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                reply = await read_frame(reader)
                if self._waiting:
                    fut = self._waiting.popleft()
                    if not fut.done():
                        fut.set_result(reply)
        except (WorkerGone, OSError, EOFError, ValueError) as exc:  # pickle errors too
            self._died(f"worker process {self.name} stopped ({type(exc).__name__}: {exc})")
        except asyncio.CancelledError:
            self._died(f"worker process {self.name} was stopped")
            raise

    def _died(self, why: str) -> None:
        if self._dead is None:
            self._dead = why
            code = None if self._proc is None else self._proc.poll()
            if code is not None:
                self._dead = f"{why}; exit code {code}"
        while self._waiting:
            fut = self._waiting.popleft()
            if not fut.done():
                fut.set_exception(WorkerDied(self._dead))

    async def call(self, request: tuple[Any, ...]) -> tuple[Any, dict[str, Any], float]:
        """``(value, operator stats, seconds)`` of one request."""
        if self._dead is not None or self._writer is None:
            raise WorkerDied(self._dead or f"worker process {self.name} is not started")
        fut: asyncio.Future[tuple[Any, ...]] = asyncio.get_running_loop().create_future()
        self._waiting.append(fut)
        try:
            self._writer.write(pack(request))
            await self._writer.drain()
        except (OSError, ConnectionError) as exc:
            self._died(f"worker process {self.name}: {exc}")
        reply = await fut
        if reply[0] != "ok":
            raise TurnFailed(str(reply[1]))
        self.turns += 1
        self.busy_s += reply[3]
        return reply[1], reply[2], reply[3]

    async def close(self) -> None:
        self._died(f"worker process {self.name} was closed")
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(OSError, ConnectionError):
                await self._writer.wait_closed()
        proc = self._proc
        if proc is not None and proc.poll() is None:
            for _ in range(20):  # it exits on EOF; give it 0.2 s
                await asyncio.sleep(0.01)
                if proc.poll() is not None:
                    break
            else:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await asyncio.to_thread(proc.wait)
