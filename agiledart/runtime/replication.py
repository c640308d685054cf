"""Replicas of a scaled-up operator on one peer (agiledart.runtime.replicas): a resize
asked for by the scaling controller is applied by the segment's task between two of its
items, when the replicas are idle; state is merged and re-split by key among the new
replicas, and snapshots of a replicated operator merge its replicas' states.
"""

from __future__ import annotations

import asyncio
import logging

from agiledart.app.errors import ExecutionError
from agiledart.app.functions import Resolver
from agiledart.app.spec import AppSpec
from agiledart.local.executor import Executor
from agiledart.runtime.execution.engines import Engine, Unit
from agiledart.runtime.replicas import merge_snapshots, split_snapshot
from agiledart.runtime.segments import Segment, op_stats

log = logging.getLogger(__name__)

__all__ = ["Replication"]


class Replication:
    """Resizes the segments of one app instance; snapshots their merged state."""

    def __init__(
        self,
        *,
        app_id: str,
        me: str,
        spec: AppSpec,
        resolve: Resolver,
        engine: Engine,
        next_uid: int,
    ) -> None:
        self.app_id, self.me, self.spec = app_id, me, spec
        self.resolve = resolve
        self.engine = engine
        self._next_uid = next_uid  #: the next replica's unit id

    def resize(self, seg: Segment, replicas: int) -> asyncio.Event:
        """Ask ``seg`` for ``replicas`` replicas; done between two of its items (the
        event returned is set then)."""
        if not seg.scalable:
            msg = f"operator {'+'.join(seg.ops)} cannot run as several instances here"
            raise ExecutionError(msg)
        seg.resized.clear()
        seg.resize_to = max(1, replicas)
        seg.wake.set()
        return seg.resized

    async def apply(self, seg: Segment) -> None:
        target, seg.resize_to = seg.resize_to, None
        try:
            if target is not None and target != seg.replicas:
                await self._set_replicas(seg, target)
        finally:
            seg.resized.set()

    async def _set_replicas(self, seg: Segment, n: int) -> None:
        """New replicas for ``seg``'s operator, its state re-split by key among them (a
        stateless one's watermarks copied to each). The old replicas are dropped only
        once the new ones are built: a factory that fails leaves the operator as it was."""
        (op,) = seg.ops
        old = list(seg.units)
        primary = old[0]
        if primary.stateful:
            snaps = [await self.engine.snapshot(u) for u in old]
            parts: list[bytes] = split_snapshot(merge_snapshots([s[op] for s in snaps]), n)
        else:  # no state but its input watermarks, which the peer keeps
            parts = [primary.executor.snapshot()[op]] * n
        try:
            executors = [
                Executor(self.spec, self.resolve, operators=[op], states={op: part})
                for part in parts
            ]
        except Exception as exc:  # user code (a factory): keep the replicas there are
            log.warning("app %s: %s stays at %d instance(s): %s", self.app_id, op, len(old), exc)
            return
        for u in old:
            for name, operator in u.executor.operators.items():
                kept = seg.retired.setdefault(name, {})
                for k, v in op_stats(operator).items():
                    kept[k] = kept.get(k, 0) + v
            await self.engine.drop_unit(u)
        units: list[Unit] = []
        for ex, part in zip(executors, parts, strict=True):
            unit = self.engine.unit(app_id=self.app_id, uid=self._next_uid, executor=ex, queue=seg)
            self._next_uid += 1
            unit.follow(primary, {op: part})
            await self.engine.add_unit(unit)
            units.append(unit)
        seg.units, seg.unit, seg.executor = units, units[0], units[0].executor
        log.info("app %s: %s now runs as %d instance(s) on %s", self.app_id, op, n, self.me)

    async def snapshot(self, seg: Segment) -> dict[str, bytes]:
        """The states of ``seg``'s operators (its replicas' merged) for a checkpoint."""
        assert seg.unit is not None
        if seg.replicas == 1:
            return await self.engine.snapshot(seg.unit)
        snaps = [await self.engine.snapshot(u) for u in seg.units]
        return {op: merge_snapshots([s[op] for s in snaps]) for op in snaps[0]}
