"""What a scheduler asks the peers hosting an app: requests whose failure is a
deployment error (:meth:`HostCalls.call`) or only logged (:meth:`HostCalls.quiet`),
undeploying, and the probes recovery and adoption decide on (does a host answer, does
it still run its instances, does it run the current generation)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from agiledart.errors import AgiledartError
from agiledart.runtime.appstate import AppRecord
from agiledart.runtime.errors import DeployError
from agiledart.runtime.links import Address, Links

log = logging.getLogger(__name__)

__all__ = ["HostCalls", "Newer"]


@dataclass(frozen=True)
class Newer:
    """A host that refused a fenced undeploy: it runs ``generation``, newer than the
    requester's, and reports to ``scheduler``."""

    peer: str
    generation: int
    scheduler: Address


class HostCalls:
    def __init__(
        self,
        *,
        name: str,
        links: Links,
        stats_of: Callable[[str], Awaitable[dict[str, Any] | None]],
    ) -> None:
        self.name = name
        self.links = links
        self._local_stats = stats_of

    async def call(
        self, address: Address, type: str, body: dict[str, Any], *, timeout: float = 10.0
    ) -> Any:
        try:
            return await self.links.request(address, type, body, timeout=timeout)
        except AgiledartError as exc:
            msg = f"{type} at {address[0]}:{address[1]} failed: {exc}"
            raise DeployError(msg) from exc

    async def quiet(self, address: Address, type: str, body: dict[str, Any]) -> Any:
        try:
            return await self.links.request(address, type, body, timeout=10.0)
        except AgiledartError as exc:
            log.warning("%s to %s failed: %s", type, address, exc)
            return None

    async def undeploy(self, rec: AppRecord, *, fenced: bool = False) -> list[Newer]:
        """Stop ``rec``'s instances on every host it knows. ``fenced``: only those of its
        generation or older; the hosts that run a newer one are returned (another
        scheduler recovered the app meanwhile, or this one's record of it was lost)."""
        body: dict[str, Any] = {"app_id": rec.app_id}
        if fenced:
            body["generation"] = rec.generation
        peers = sorted(rec.known_addresses().items())
        replies = await asyncio.gather(*(self.quiet(a, "undeploy", body) for _, a in peers))
        newer: list[Newer] = []
        for (peer, _), reply in zip(peers, replies, strict=True):
            if not isinstance(reply, dict) or reply.get("undeployed") is not False:
                continue
            generation, scheduler = reply.get("generation"), reply.get("scheduler")
            if type(generation) is int and isinstance(scheduler, list) and len(scheduler) == 2:
                newer.append(Newer(peer, generation, (str(scheduler[0]), int(scheduler[1]))))
        return newer

    async def gather(self, rec: AppRecord) -> dict[str, Any]:
        """Every hosting peer's statistics of ``rec``'s instance."""
        addresses = rec.known_addresses()

        async def one(peer: str) -> tuple[str, Any]:
            if peer == self.name:
                return peer, await self._local_stats(rec.app_id)
            return peer, await self.quiet(addresses[peer], "app_stats", {"app_id": rec.app_id})

        got = await asyncio.gather(*(one(p) for p in sorted(addresses)))
        return {p: s for p, s in got if s is not None}

    async def ring_answers(self, address: Address, timeout: float = 3.0) -> bool:
        """Whether the peer at ``address`` answers a ``ring`` request now."""
        try:
            await self.links.request(address, "ring", {}, timeout=timeout)
        except AgiledartError:
            return False
        return True

    async def answers(self, rec: AppRecord, peer: str) -> bool:
        """Whether ``peer``, a host of ``rec``, answers a ``ring`` request now."""
        if peer not in rec.addresses:
            return False
        return await self.ring_answers(rec.address_of(peer))

    async def _app_stats(self, rec: AppRecord, peer: str, timeout: float) -> tuple[bool, Any]:
        """Whether ``peer`` answered ``app_stats`` of ``rec``, and its answer."""
        body = {"app_id": rec.app_id}
        address = rec.address_of(peer)
        try:
            return True, await self.links.request(address, "app_stats", body, timeout=timeout)
        except AgiledartError:
            return False, None

    async def sinks_ended(self, rec: AppRecord) -> bool:
        """Whether every sink of ``rec`` ended in its current generation (their peers
        say so): the app finished, whoever its reports went to."""
        if not rec.sinks:
            return False
        peers = sorted(set(rec.sinks.values()))
        answers = await asyncio.gather(*(self._app_stats(rec, p, 3.0) for p in peers))
        stats = {p: got for p, (_, got) in zip(peers, answers, strict=True)}
        for sink, peer in rec.sinks.items():
            got = stats.get(peer)
            if not isinstance(got, dict) or got.get("generation") != rec.generation:
                return False
            info = (got.get("sinks") or {}).get(sink)
            if not isinstance(info, dict) or info.get("ended") is not True:
                return False
        return True

    async def runs(self, rec: AppRecord, peer: str) -> bool:
        """Whether ``peer`` (which answers) still runs its instances of ``rec``."""
        if peer not in rec.addresses:
            return False
        answered, stats = await self._app_stats(rec, peer, 5.0)
        return not answered or stats is not None  # not known to be gone: the failure stands

    async def runs_now(self, rec: AppRecord, peer: str) -> bool:
        """Whether ``peer`` answers and runs the current generation of ``rec``."""
        if peer not in rec.addresses:
            return False
        answered, stats = await self._app_stats(rec, peer, 1.5)
        return answered and isinstance(stats, dict) and stats.get("generation") == rec.generation
