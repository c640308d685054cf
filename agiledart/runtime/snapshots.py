"""One app instance's part in checkpoints (agiledart.runtime.epochs): barriers into its
sources' output, a segment's snapshot once its inputs are aligned, stored as erasure-
coded fragments on leaf-set peers in the background, and, on a recovery, every stateful
operator's state of the committed epoch restored before anything runs.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import msgpack

from agiledart.app.errors import ExecutionError
from agiledart.runtime.connectors import SourceConnector
from agiledart.runtime.http import HttpSource
from agiledart.runtime.links import Links
from agiledart.runtime.mqtt import MqttSource
from agiledart.runtime.recovery import CheckpointError, Holder, Uplink, fit_code, load, save
from agiledart.runtime.replication import Replication
from agiledart.runtime.routing import Router
from agiledart.runtime.segments import Segment
from agiledart.runtime.topology import LocalTopology

log = logging.getLogger(__name__)

__all__ = ["InstanceCheckpoints"]


class InstanceCheckpoints:
    """Barriers, snapshots and restores of one app instance."""

    def __init__(
        self,
        *,
        app_id: str,
        topology: LocalTopology,
        router: Router,
        replication: Replication,
        sources: Mapping[str, SourceConnector],
        source_locks: Mapping[str, asyncio.Lock],
        segment_of: Mapping[str, Segment],
        links: Links,
        report: Callable[[int, dict[str, Any]], Awaitable[None]],
        spawn: Callable[[Awaitable[None]], Any],
        on_checkpoint: Callable[[dict[str, Any]], Awaitable[None]] | None,
        holders: Callable[[int], list[Holder]] | None,
        uplink: Uplink | None,
        restore: dict[str, Any],
    ) -> None:
        self.app_id, self.me = app_id, topology.me
        self.spec = topology.spec
        self.topology = topology
        self.router = router
        self.replication = replication
        self.sources = sources
        self._source_locks = source_locks
        self.segment_of = segment_of
        self.links = links
        self.report = report
        self.spawn = spawn
        self.on_checkpoint = on_checkpoint
        self.holders = holders
        self.uplink = uplink
        self.restore = restore
        self._lowered: set[str] = set()  #: instances told to checkpoint with a lower m, k

    async def inject_barrier(self, epoch: int) -> None:
        """Barrier ``epoch`` into every local source's output, between two batches, and
        each source's offset to the scheduler (or that it has finished)."""
        for sid, source in self.sources.items():
            async with self._source_locks[sid]:
                finished = source.stats.finished
                if not finished:
                    await self.router.deliver_barrier(sid, epoch)
                offset = (
                    source.checkpoint(epoch)
                    if isinstance(source, MqttSource | HttpSource)
                    else source.stats.emitted
                )
            report = {"kind": "source", "id": sid, "offset": offset, "finished": finished}
            if isinstance(source, MqttSource) and (ids := source.replay_ids(offset)):
                report["replay"] = ids  # the broker's redeliveries a moved source drops
            await self.report(epoch, report)

    async def aligned(self, seg: Segment, epoch: int) -> None:
        """Every open input of ``seg`` passed barrier ``epoch``: snapshot, forward the
        barrier, store the snapshot in the background, let the held input in."""
        assert seg.unit is not None
        if seg.unit.stateful and self.on_checkpoint is not None:
            states = await self.replication.snapshot(seg)
            stateful = sorted(o for o in seg.ops if self.spec.operator(o).stateful)
            blob = msgpack.packb({o: states[o] for o in stateful})
            self.spawn(self._save(seg, stateful, epoch, blob))
        for op in seg.ops:
            if self.topology.leaves(op, seg.ops):
                await self.router.deliver_barrier(op, epoch)
        if seg.held:
            seg.inbox.extendleft(reversed(seg.held))
            seg.held.clear()
            seg.wake.set()

    async def _save(self, seg: Segment, ops: list[str], epoch: int, blob: bytes) -> None:
        report = await self.keep(f"{'+'.join(seg.ops)}@{self.me}", epoch, blob)
        await self.report(epoch, {**report, "ops": ops} if report["kind"] == "state" else report)

    async def keep(self, instance: str, epoch: int, blob: bytes) -> dict[str, Any]:
        """``blob``, what ``instance`` keeps of checkpoint ``epoch``, stored as
        fragments on leaf-set peers: the ``state`` report naming its holders, or a
        ``state_failed`` one."""
        cp = self.spec.checkpoint
        m, k = (1, cp.k) if cp.mode == "replication" else (cp.m, cp.k)
        holders = self.holders(m + k) if self.holders is not None else []
        fitted = fit_code(m, k, len(holders))
        if fitted is None:
            error = "no leaf-set peer can hold its fragments"
            return {"kind": "state_failed", "instance": instance, "error": error}
        if fitted != (m, k):
            if instance not in self._lowered:
                self._lowered.add(instance)
                log.warning(
                    "app %s: checkpoints of %s use m=%d, k=%d: %d leaf-set peers hold "
                    "fragments, m=%d, k=%d needs %d",
                    self.app_id, instance, *fitted, len(holders), m, k, m + k,
                )  # fmt: skip
            m, k = fitted
        try:
            receipt = await save(
                self.links,
                holders,
                blob,
                app=self.app_id,
                instance=instance,
                epoch=epoch,
                m=m,
                k=k,
                uplink=self.uplink,
            )
        except CheckpointError as exc:
            log.warning(
                "app %s: checkpoint %d of %s not stored: %s", self.app_id, epoch, instance, exc
            )
            return {"kind": "state_failed", "instance": instance, "error": str(exc)}
        return {
            "kind": "state",
            "instance": instance,
            "holders": [[h.name, list(h.address)] for h in holders],
            "m": m,
            "k": k,
            "bytes": receipt.bytes,
            "seconds": round(receipt.seconds, 4),
        }

    async def fetch(self, entry: Mapping[str, Any], epoch: int) -> bytes:
        """What ``entry`` (a ``state`` report) stored of checkpoint ``epoch``, fetched
        from m of its holders and decoded."""
        holders = [Holder(str(n), (str(a[0]), int(a[1]))) for n, a in entry["holders"]]
        return await load(
            self.links,
            holders,
            app=self.app_id,
            instance=str(entry["instance"]),
            epoch=epoch,
            m=int(entry["m"]),
        )

    async def restore_states(self) -> None:
        """Before anything runs: every stateful operator here gets its state of the
        committed epoch, fetched from m holders in parallel and decoded."""
        plan = self.restore
        wanted = [
            entry
            for entry in plan.get("states", ())
            if entry["peer"] == self.me and any(o in self.segment_of for o in entry["ops"])
        ]

        async def fetch(entry: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
            return entry, await self.fetch(entry, int(plan["epoch"]))

        try:
            got = await asyncio.gather(*(fetch(e) for e in wanted))
        except CheckpointError as exc:
            raise ExecutionError(str(exc)) from None
        for _, blob in got:
            states = msgpack.unpackb(blob)
            for op, data in states.items():
                seg = self.segment_of.get(op)
                if seg is not None:
                    seg.executor.operators[op].restore(data)
