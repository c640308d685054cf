"""The centralized baseline (paper §VII-B, Fig. 8): one Storm-like master.

Storm's Nimbus (and EdgeWise, built on it) deploys applications first come, first
served: one master, one queue, one topology at a time. With ``agiledart peer
--scheduling central --master NAME`` every peer hands submits to the peer ``NAME``
(``central_submit``); there :class:`CentralMaster` puts them in a single FIFO queue
and one task takes them out one by one, each scheduled completely (validated,
recorded, JOIN-routed, placed, deployed, started) by the master's
:class:`~agiledart.runtime.scheduler.Scheduler` before the next one starts. Its
answer says how long the app waited in the queue (``queue_ms``) and how long its
deployment took once taken out (``deploy_ms``), so benchmarks can measure the
bottleneck the paper's Fig. 8 shows.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from agiledart.app.parse import Overrides, parse_spec
from agiledart.errors import AgiledartError
from agiledart.overlay.errors import MalformedError, OverlayError
from agiledart.overlay.tcp import ConnectionInfo
from agiledart.runtime.errors import MasterBusy, MasterUnknown
from agiledart.runtime.links import Address, Links
from agiledart.runtime.scheduler import Scheduler

__all__ = ["CentralMaster", "MasterBusy", "MasterUnknown"]

Handler = Callable[[dict[str, Any], ConnectionInfo], Awaitable[Any]]


@dataclass
class _Job:
    source: Any
    overrides: list[str]
    enqueued: float
    done: asyncio.Future[dict[str, Any]]


class CentralMaster:
    """Submits go to one master; the master deploys them one at a time, FCFS."""

    def __init__(
        self,
        *,
        name: str,
        master: str,
        scheduler: Scheduler,
        links: Links,
        resolve: Callable[[str], Awaitable[tuple[int, Address] | None]],
        max_queue: int = 100_000,
    ) -> None:
        self.name, self.master = name, master
        self.scheduler = scheduler
        self.links = links
        self._resolve = resolve
        self.queue: asyncio.Queue[_Job] = asyncio.Queue(max_queue)
        self.deployed = 0

    @property
    def is_master(self) -> bool:
        return self.name == self.master

    def handlers(self) -> dict[str, Handler]:
        return {"central_submit": self._on_submit}

    def info(self) -> dict[str, Any]:
        return {
            "mode": "central",
            "master": self.master,
            "queued": self.queue.qsize(),
            "deployed": self.deployed,
        }

    async def run(self) -> None:
        """The master's one deployment loop (a child of the peer's task group)."""
        while True:
            job = await self.queue.get()
            if job.done.done():  # the submitter went away
                continue
            started = time.monotonic()
            try:
                rec = await self.scheduler.submit(job.source, job.overrides)
            except AgiledartError as exc:
                job.done.set_exception(exc)
                continue
            self.deployed += 1
            job.done.set_result(
                {
                    "app_id": rec.app_id,
                    "state": rec.state,
                    "warnings": self.scheduler.warnings(rec),
                    "placement": rec.placement,
                    "scheduler": self.name,
                    "queue_ms": round((started - job.enqueued) * 1000, 3),
                    "deploy_ms": round((time.monotonic() - started) * 1000, 3),
                }
            )

    async def submit(self, source: Any, overrides: Overrides = ()) -> dict[str, Any]:
        """At any peer: to the master's queue (this one's, if it is the master)."""
        parse_spec(source, overrides=overrides)  # a bad spec goes no further than here
        if self.is_master:
            return await self._enqueue(source, list(overrides))
        found = await self._resolve(self.master)
        if found is None:
            msg = f"master peer {self.master!r} is not known in the ring"
            raise MasterUnknown(msg)
        body = {"spec": source, "set": list(overrides)}
        try:
            res = await self.links.request(found[1], "central_submit", body, timeout=3600.0)
        except OverlayError as exc:
            if exc.remote_peer is not None:
                raise  # the master failed the app: its error stands, in its own type
            msg = f"master peer {self.master!r} unreachable: {exc}"
            raise MasterUnknown(msg) from None
        if not isinstance(res, dict):
            msg = "central_submit answered something that is not a map"
            raise MalformedError(msg)
        return res

    async def _enqueue(self, source: Any, overrides: list[str]) -> dict[str, Any]:
        job = _Job(source, overrides, time.monotonic(), asyncio.get_running_loop().create_future())
        try:
            self.queue.put_nowait(job)
        except asyncio.QueueFull:
            msg = f"the master's queue is full ({self.queue.maxsize} apps waiting)"
            raise MasterBusy(msg) from None
        return await job.done

    async def _on_submit(self, req: dict[str, Any], conn: ConnectionInfo) -> dict[str, Any]:
        source, overrides = req.get("spec"), req.get("set") or []
        if not isinstance(source, str | dict) or not isinstance(overrides, list):
            msg = "central_submit needs 'spec' and 'set'"
            raise MalformedError(msg)
        if not self.is_master:
            msg = f"{self.name} is not the master (the master is {self.master!r})"
            raise MasterUnknown(msg)
        return await self._enqueue(source, [str(o) for o in overrides])
