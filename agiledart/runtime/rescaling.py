"""Rescaling (agiledart.runtime.scaling): a controller asks the app's scheduler for a
scale-out (a stateless operator gets one more instance on a leaf-set peer) or a
migration (a stateful operator's instance moves there with its state). The scheduler
cuts a checkpoint, then redeploys the app from it, the recovery path: sources replay
from their offsets, file sinks are cut back to what was committed, states restored
where they now run."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from agiledart.errors import AgiledartError
from agiledart.runtime.appstate import AppRecord
from agiledart.runtime.epochs import restore_plan
from agiledart.runtime.failover import app_hosts, consumers_first, replaced
from agiledart.runtime.links import Address

if TYPE_CHECKING:
    from agiledart.runtime.scheduler import Scheduler

log = logging.getLogger(__name__)

__all__ = ["Rescaling"]


class Rescaling:
    def __init__(self, scheduler: Scheduler) -> None:
        self.s = scheduler

    async def rescale(
        self,
        app_id: str,
        operators: Sequence[str],
        action: str,
        peer: str,
        *,
        generation: int,
        reason: str = "",
    ) -> bool:
        """``peer``'s controller of ``operators`` asks for a scale-out (stateless: one
        more instance on a leaf-set peer of it) or a migration (stateful: its instance
        moves there, with its state). Carried out in the background; False if the app
        or its generation is not (any more) the one asked about."""
        rec = self.s.apps.get(app_id)
        if (
            rec is None
            or not rec.live
            or generation != rec.generation
            or action not in ("scale-out", "migrate")
            or not operators
            or any(peer not in rec.placement.get(op, ()) for op in operators)
        ):
            return False
        cooldown = self.s.spec_of(rec).scaling.cooldown_ms / 1000.0
        recent = [
            e
            for e in rec.rescales
            if "refused" not in e
            and set(e["operators"]) & set(operators)
            and time.time() - float(e["at"]) < cooldown
        ]
        if recent:  # moved a moment ago: its new host has not settled yet
            return False
        self.s.tasks.spawn(self._rescale(app_id, list(operators), action, peer, generation, reason))
        return True

    async def _rescale(
        self, app_id: str, ops: list[str], action: str, peer: str, generation: int, reason: str
    ) -> None:
        """Cut a checkpoint, then redeploy the app from it with ``ops`` on a leaf-set
        peer of ``peer`` (the recovery path: sources replay from their offsets, file
        sinks are cut back to what was committed, states restored where they run)."""
        held = self.s.scheduled.get(app_id)
        if held is None:
            return
        async with held.lock:
            app = self.s.scheduled.get(app_id)
            if app is None or not app.record.live or app.record.generation != generation:
                return
            rec = app.record
            if not await self.s.still_mine(rec):
                return  # adopted while this peer was away
            started = time.monotonic()
            event: dict[str, Any] = {
                "action": action,
                "operators": ops,
                "from": peer,
                "reason": reason,
                "at": time.time(),
            }
            target = await self._elastic_peer(rec, peer)
            epoch = None if target is None else await self.s.checkpoints.cut_now(app)
            if target is None or epoch is None or not rec.live:
                event["refused"] = "no leaf-set peer free" if target is None else "no checkpoint"
                rec.rescales.append(event)
                await self.s.save(rec)
                return
            name = target[0]
            try:
                await self._redeploy(rec, ops, action, peer, target)
            except AgiledartError as exc:
                log.warning("app %s: %s to %s failed: %s", app_id, action, name, exc)
                await self.s.fail(rec, f"{action} of {', '.join(ops)} to {name} failed: {exc}")
                return
            event |= {"to": name, "epoch": epoch, "seconds": round(time.monotonic() - started, 3)}
            rec.rescales.append(event)
            log.info("app %s: %s of %s from %s to %s", app_id, action, ops, peer, name)
            await self.s.save(rec)

    async def _redeploy(
        self, rec: AppRecord, ops: list[str], action: str, peer: str, target: tuple[str, Address]
    ) -> None:
        """Redeploy ``rec`` from its last commit with ``ops`` moved from (or added
        beside) ``peer`` onto ``target``."""
        name, address = target
        for op in ops:
            peers = rec.placement[op]
            rec.placement[op] = (
                [name if p == peer else p for p in peers] if action == "migrate" else [*peers, name]
            )
        addresses = rec.known_addresses()
        addresses[name] = address
        await self.s.hosts.undeploy(rec)
        self.s.next_generation(rec)
        spec = self.s.spec_of(rec)
        hosts = app_hosts(spec, rec.placement, rec.sources, rec.sinks)
        assert rec.checkpoint is not None
        plan = restore_plan(rec.checkpoint, {})
        if action == "migrate":  # the moved operators' states go with them
            plan["states"] += [
                {**e, "peer": name}
                for e in plan["states"]
                if e["peer"] == peer and set(e["ops"]) & set(ops)
            ]
            rec.checkpoint = {**rec.checkpoint, "states": plan["states"]}  # for a recovery
        for i, path in enumerate(rec.paths):
            if action == "migrate" and peer not in rec.hosts():
                rec.paths[i] = replaced(path, peer, name)
        order = consumers_first(spec, hosts)
        await self.s.install(rec, spec, hosts, addresses, order, restore=plan)

    async def _elastic_peer(self, rec: AppRecord, peer: str) -> tuple[str, Address] | None:
        """The closest leaf-set peer of ``peer`` that hosts nothing of ``rec`` and answers."""
        try:
            ring = await self.s.links.request(rec.address_of(peer), "ring", {}, timeout=5.0)
        except AgiledartError:
            return None
        known: dict[str, Address] = {}
        for p in ring.get("peers", ()):
            host, _, port = str(p.get("address", "")).rpartition(":")
            if host and port.isdigit():
                known[str(p.get("name"))] = (host, int(port))
        busy = rec.hosts()
        for name in ring.get("leaf_set", ()):
            address = known.get(str(name))
            if name in busy or address is None:
                continue
            if await self.s.hosts.ring_answers(address):
                return str(name), address
        return None
