"""A real aiohttp receiver on loopback for the http sink's tests: it records every
POST (its ``Idempotency-Key``, ``Authorization`` and JSON body) and answers with the
status it is told, so a test can stage an outage (503) or a refusal (400)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from aiohttp import web


@dataclass(frozen=True)
class Request:
    key: str | None
    authorization: str | None
    records: list[dict[str, Any]]
    status: int  #: what the receiver answered


class Receiver:
    """Serves ``http://127.0.0.1:{port}/in`` from its own thread."""

    def __init__(self) -> None:
        self.requests: list[Request] = []
        #: the statuses to answer next, in order; then ``status``
        self.plan: list[int] = []
        self.status = 200
        self.reason = "receiver says no"
        self._lock = threading.Lock()
        self.port = 0

    async def _post(self, request: web.Request) -> web.Response:
        records = await request.json()
        with self._lock:
            status = self.plan.pop(0) if self.plan else self.status
            self.requests.append(
                Request(
                    request.headers.get("Idempotency-Key"),
                    request.headers.get("Authorization"),
                    records,
                    status,
                )
            )
        if status >= 300:
            return web.Response(status=status, text=self.reason)
        return web.json_response({"ok": True}, status=status)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/in"

    def taken(self) -> list[Request]:
        """The requests answered 2xx, each key once (its first), in arrival order."""
        seen: set[str | None] = set()
        out = []
        with self._lock:
            for r in self.requests:
                if r.status < 300 and r.key not in seen:
                    seen.add(r.key)
                    out.append(r)
        return out

    def records(self) -> list[dict[str, Any]]:
        """What a receiver that drops repeated keys keeps, in order."""
        return [rec for r in self.taken() for rec in r.records]

    def answered(self, status: int) -> int:
        with self._lock:
            return sum(1 for r in self.requests if r.status == status)


@contextmanager
def running_receiver() -> Iterator[Receiver]:
    receiver = Receiver()
    loop = asyncio.new_event_loop()
    app = web.Application()
    app.router.add_post("/in", receiver._post)
    runner = web.AppRunner(app)

    async def start() -> None:
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        receiver.port = runner.addresses[0][1]

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    try:
        yield receiver
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
