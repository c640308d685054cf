"""How a peer runs its operator instances: in its own loop, on a worker pool, or one
process each.

Theory of operation (EdgeWise, ATC'19 §4; Lachesis, Middleware'21 §3)
--------------------------------------------------------------------
The app instance keeps every operator instance's input queue in the peer process and
drives each queue with one task that asks its :class:`Unit` to run a *turn*: at most
``turn`` tuples of the queue's head batch (or one watermark). Outputs come back to the
peer, which puts them in the downstream queues or on the network. What differs is who
runs the turn:

* ``inline`` (``--workers 0``): the peer's own event loop, operators chained in groups
  (the engine for one-core devices, and the fastest for cheap operators);
* ``edgewise`` / ``random``: a fixed pool of worker processes. A free worker takes the
  waiting queue with the longest pending input (``random``: any waiting queue), never
  one another worker is running; it runs the turn without preemption, hands the output
  back and asks again; with no waiting queue it sleeps. Operator state lives in the
  worker that ran the queue last; a queue taken by another worker has its state moved
  (snapshot, restore) first, and a free holder is preferred, so moves are rare;
* ``os`` (OWPOA, the Storm/Flink baseline): one process per operator instance; the OS
  decides which runs;
* ``lachesis``: ``os`` plus a controller that every period reads the queues and sets
  the processes' nice values by policy ``qs``, ``fcfs`` or ``hr``.

Every unit starts in the peer's loop and is measured: only one whose records cost more
than ``offload_us`` each moves to the workers (its state handed over with its first
turn there). A cheap operator costs less than a turn's round trip to a worker; moving
it would only add that round trip (``bench_pipeline.py``: 830,000 records/s in the
loop, 54,000 with every operator in the pool).

Watermarks of stateless operators are a minimum over inputs and run no user code: the
peer computes them itself, so a stateless operator's records can run on any worker.
Tuples between operators on one peer cross two pipes per hop (worker -> peer ->
worker), in batches of up to ``turn`` records: cheaper than a shared-memory ring in
Python once pickling is counted, and the peer must see every queue anyway to schedule.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any, Protocol

from agiledart.app.errors import ExecutionError
from agiledart.app.spec import AppSpec
from agiledart.local.executor import Emission, Executor
from agiledart.operators.base import OperatorStats
from agiledart.runtime.execution.config import EngineConfig
from agiledart.runtime.execution.host import WorkerDied, WorkerProcess
from agiledart.runtime.execution.lachesis import LachesisController
from agiledart.runtime.execution.policy import Dispatcher, InstanceLoad

log = logging.getLogger(__name__)

__all__ = [
    "Engine",
    "InlineEngine",
    "PoolEngine",
    "ProcessEngine",
    "Unit",
    "make_engine",
]


class Queue(Protocol):
    """What an engine may read of the queue a unit drains."""

    @property
    def pending(self) -> int: ...  # tuples (and watermarks) waiting

    def oldest_s(self, now: float) -> float | None: ...  # age of the head item

    def rate(self, now: float) -> float: ...  # input tuples/s


#: a unit running in the peer is judged every this many records, or this much time in
#: the loop, whichever comes first (a costly operator blocks the loop ~50 ms at most)
PROBE_RECORDS = 2000
PROBE_S = 0.05


class Unit:
    """One operator instance (or, inline, a chained group) as its engine runs it.

    Every unit starts in the peer's loop (``local``) and is measured; one whose records
    cost more than the engine's ``offload_us`` each moves to the workers for good,
    its state handed over with its first turn there. A cheap operator costs less than
    the round trip to a worker (~100 us a turn), so it stays. Until it is first judged
    it runs in turns like a worker's, so an unknown operator cannot hold the loop long.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        app_id: str,
        uid: int,
        executor: Executor,
        queue: Queue,
    ) -> None:
        self.engine = engine
        self.app_id = app_id
        self.uid = uid
        self.executor = executor  #: run here while local; else counters and watermarks
        self.queue = queue
        self.stateful = any(op.stateful for op in executor.operators.values())
        self.local = True
        self.handover: dict[str, bytes] | None = None  #: state for its first remote turn
        self.holder: int | None = None  #: the worker holding the state (pool)
        self.process: WorkerProcess | None = None  #: its own process (os, lachesis)
        self.wait_s = 0.0  #: the last turn's wait for a worker
        self.service_s = 0.0  #: the last turn's execution time
        self._probe = [0, 0.0]  #: records and seconds measured here since the last check
        self._judged = engine.offload_s is None

    @property
    def ops(self) -> list[str]:
        return list(self.executor.operators)

    @property
    def turn(self) -> int | None:
        """Tuples per turn, at most (None: the whole batch)."""
        if not self.local:
            return self.engine.turn
        return None if self._judged else self.engine.config.turn

    async def feed(self, producer: str, records: list[Any]) -> list[Emission]:
        if not self.local:
            return await self.engine.run(self, "feed", producer, records)
        start = time.perf_counter()
        out = self.executor.feed(producer, records)
        self.service_s, self.wait_s = time.perf_counter() - start, 0.0
        self._measure(len(records))
        return out

    def _measure(self, records: int) -> None:
        limit = self.engine.offload_s
        if limit is None:
            return
        probe = self._probe
        probe[0] += records
        probe[1] += self.service_s
        if probe[0] < PROBE_RECORDS and probe[1] < PROBE_S:
            return
        self._judged = True
        if probe[1] / probe[0] > limit:
            self.local = False
            if self.stateful:
                self.handover = self.executor.snapshot()
            log.info(
                "app %s: %s costs %.1f us a record: moved to the workers",
                self.app_id,
                "+".join(self.ops),
                probe[1] / probe[0] * 1e6,
            )
        probe[0], probe[1] = 0, 0.0

    async def watermark(self, producer: str, wm: int) -> list[Emission]:
        if self.stateful and not self.local:
            return await self.engine.run(self, "wm", producer, wm)
        start = time.perf_counter()
        out = self.executor.watermark(producer, wm)  # no user code: here is cheapest
        self.service_s, self.wait_s = time.perf_counter() - start, 0.0
        return out

    def follow(self, other: Unit, state: dict[str, bytes] | None) -> None:
        """Start where ``other`` runs (a replica replacing it): on the workers if it
        had moved there, ``state`` then handed over with the first turn."""
        if not other.local:
            self.local, self._judged = False, True
            self.handover = state if self.stateful else None

    def take_handover(self) -> dict[str, bytes] | None:
        state, self.handover = self.handover, None
        return state

    def add_stats(self, stats: dict[str, dict[str, Any]]) -> None:
        for name, delta in stats.items():
            op = self.executor.operators.get(name)
            if op is None:
                continue
            _add(op.stats, delta)


def _add(stats: OperatorStats, delta: dict[str, Any]) -> None:
    stats.records_in += int(delta.get("records_in", 0))
    stats.records_out += int(delta.get("records_out", 0))
    stats.late += int(delta.get("late", 0))
    stats.errors += int(delta.get("errors", 0))
    if delta.get("last_error"):
        stats.last_error = str(delta["last_error"])
    for error in delta.get("recent_errors") or ():
        if isinstance(error, dict) and {"type", "message"} <= set(error):
            stats.note_error(error)
    stats.failed += [e for e in delta.get("failed") or () if isinstance(e, dict)]


class Engine:
    """Runs turns of units; one per peer, shared by its apps."""

    #: tuples per turn (None: the whole batch) and whether operators are chained
    turn: int | None = None
    chains: bool = False

    def __init__(self, config: EngineConfig, cache_dir: Path) -> None:
        self.config = config
        self.cache_dir = cache_dir
        #: seconds a record may cost in the peer's loop (None: no limit, all stay)
        self.offload_s: float | None = config.offload_us / 1e6
        self._group: asyncio.TaskGroup | None = None
        self.units: dict[tuple[str, int], Unit] = {}
        self._apps: dict[str, tuple[dict[str, Any], dict[int, list[str]], list[str]]] = {}

    @property
    def name(self) -> str:
        return self.config.name

    def start(self, group: asyncio.TaskGroup) -> None:
        self._group = group

    def unit(self, *, app_id: str, uid: int, executor: Executor, queue: Queue) -> Unit:
        """A unit of an app; it runs once :meth:`open_app` has taken the app's units."""
        return Unit(self, app_id=app_id, uid=uid, executor=executor, queue=queue)

    async def open_app(
        self, app_id: str, spec: AppSpec, units: Sequence[Unit], code_ids: Collection[str]
    ) -> None:
        for u in units:
            self.units[(app_id, u.uid)] = u
        ops = {u.uid: u.ops for u in units}
        self._apps[app_id] = (spec.to_dict(), ops, sorted(code_ids))

    async def add_unit(self, unit: Unit) -> None:
        """A unit added to an app that is open (elastic scaling: one more instance)."""
        self.units[(unit.app_id, unit.uid)] = unit
        entry = self._apps.get(unit.app_id)
        if entry is not None:
            entry[1][unit.uid] = unit.ops

    async def drop_unit(self, unit: Unit) -> None:
        """Forget a unit of an open app; its state must have been taken (:meth:`snapshot`)."""
        self.units.pop((unit.app_id, unit.uid), None)
        entry = self._apps.get(unit.app_id)
        if entry is not None:
            entry[1].pop(unit.uid, None)

    def units_of(self, app_id: str) -> list[Unit]:
        """The app's units (a list: other apps come and go while one is awaited)."""
        return [u for (a, _), u in list(self.units.items()) if a == app_id]

    async def close_app(self, app_id: str) -> None:
        self._apps.pop(app_id, None)
        for key in [k for k in self.units if k[0] == app_id]:
            del self.units[key]

    async def run(self, unit: Unit, kind: str, producer: str, what: Any) -> list[Emission]:
        raise NotImplementedError

    async def snapshot(self, unit: Unit) -> dict[str, bytes]:
        """Every operator's state of ``unit`` wherever it runs, for a checkpoint. Called
        between two of its turns (by the task that runs them); a state held by a worker
        comes back to the peer and goes out again with the unit's next turn."""
        if unit.local or not unit.stateful:
            return unit.executor.snapshot()
        if unit.handover is not None:
            return dict(unit.handover)
        state = await self._take_state(unit)
        if state is None:
            return unit.executor.snapshot()
        unit.handover = state
        return dict(state)

    async def _take_state(self, unit: Unit) -> dict[str, bytes] | None:
        return None

    async def aclose(self) -> None:
        return None

    def info(self) -> dict[str, Any]:
        units = list(self.units.values())
        return {
            "scheduler": self.name,
            "workers": self.config.workers,
            "turn": self.turn,
            "offload_us": None if self.offload_s is None else self.config.offload_us,
            "in_peer": sorted(f"{u.app_id}/{'+'.join(u.ops)}" for u in units if u.local),
            "in_workers": sorted(f"{u.app_id}/{'+'.join(u.ops)}" for u in units if not u.local),
        }

    def _define(self, app_id: str) -> tuple[Any, ...]:
        spec, units, code_ids = self._apps[app_id]
        return ("app", app_id, spec, units, code_ids, str(self.cache_dir))

    def _require_group(self) -> asyncio.TaskGroup:
        if self._group is None:
            msg = "the execution engine is not running"
            raise ExecutionError(msg)
        return self._group


class InlineEngine(Engine):
    chains = True

    def __init__(self, config: EngineConfig, cache_dir: Path) -> None:
        super().__init__(config, cache_dir)
        self.offload_s = None

    async def run(self, unit: Unit, kind: str, producer: str, what: Any) -> list[Emission]:
        start = time.perf_counter()
        ex = unit.executor
        out = ex.feed(producer, what) if kind == "feed" else ex.watermark(producer, what)
        unit.service_s, unit.wait_s = time.perf_counter() - start, 0.0
        return out


#: turns a pool worker holds, the one it runs included: the next waits in its socket,
#: so the worker never idles while the peer hands the last turn's output on
PREFETCH = 2


class PoolEngine(Engine):
    """A fixed pool of worker processes under the EdgeWise (or random) dispatcher."""

    def __init__(self, config: EngineConfig, cache_dir: Path, *, rng: random.Random) -> None:
        super().__init__(config, cache_dir)
        self.turn = config.turn
        self.procs: list[WorkerProcess | None] = [None] * config.workers
        self._locks = [asyncio.Lock() for _ in range(config.workers)]
        self._defined: list[set[str]] = [set() for _ in range(config.workers)]
        self._grants: dict[Unit, asyncio.Future[int]] = {}
        self.dispatcher: Dispatcher[Unit] = Dispatcher(
            config.workers * PREFETCH,  # slot s is worker s % workers
            config.scheduler,
            pending=self._pending,
            rng=rng,
            holder=lambda u: u.holder,
        )
        self.migrations = 0

    def _pending(self, unit: Unit) -> int:
        """The queue length the dispatcher sees: a unit asks for one turn at a time,
        with work (a watermark due after the queue's last batch counts as one)."""
        return max(1, unit.queue.pending) if unit in self._grants else 0

    async def run(self, unit: Unit, kind: str, producer: str, what: Any) -> list[Emission]:
        asked = time.monotonic()
        slot = await self._grant(unit)
        w = slot % self.config.workers
        unit.wait_s = time.monotonic() - asked
        try:
            await self._define_on(w, unit.app_id)  # a worker that was restarted
            proc = await self._worker(w)
            state = unit.take_handover()
            if unit.stateful and unit.holder is not None and unit.holder != w:
                state = await self._export(unit)
            out, stats, unit.service_s = await proc.call(
                (kind, unit.app_id, unit.uid, producer, what, state)
            )
            if unit.stateful:
                unit.holder = w
        finally:
            self.dispatcher.done(slot)
            self._dispatch()
        unit.add_stats(stats)
        return out  # type: ignore[no-any-return]

    async def _grant(self, unit: Unit) -> int:
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._grants[unit] = fut
        self.dispatcher.want(unit)
        self._dispatch()
        try:
            return await fut
        except asyncio.CancelledError:
            self._grants.pop(unit, None)
            self.dispatcher.cancel(unit)
            if fut.done() and not fut.cancelled():  # granted as we were cancelled
                self.dispatcher.done(fut.result())
                self._dispatch()
            raise

    def _dispatch(self) -> None:
        for w, unit in self.dispatcher.dispatch():
            fut = self._grants.pop(unit, None)
            if fut is None or fut.done():
                self.dispatcher.done(w)
                continue
            fut.set_result(w)

    async def _take_state(self, unit: Unit) -> dict[str, bytes] | None:
        if unit.holder is None:
            return None
        state = await self._export(unit)
        unit.holder = None
        return state

    async def _export(self, unit: Unit) -> dict[str, bytes]:
        assert unit.holder is not None
        holder = self.procs[unit.holder]
        if holder is None or not holder.alive:
            msg = f"the state of {unit.ops} was lost with its worker process"
            raise WorkerDied(msg)
        state, _, _ = await holder.call(("export", unit.app_id, unit.uid))
        self.migrations += 1
        if state is None:
            msg = f"worker {unit.holder} no longer holds the state of {unit.ops}"
            raise ExecutionError(msg)
        return state  # type: ignore[no-any-return]

    async def _worker(self, w: int) -> WorkerProcess:
        async with self._locks[w]:  # one start at a time per slot
            proc = self.procs[w]
            if proc is None or not proc.alive:
                proc = await self._spawn(w)
            return proc

    async def _spawn(self, w: int) -> WorkerProcess:
        old = self.procs[w]
        if old is not None:
            await old.close()
            for (app_id, _), u in list(self.units.items()):  # its states are gone
                if u.holder == w:
                    u.holder = None
                    log.warning("app %s: worker %d died holding %s", app_id, w, u.ops)
        proc = WorkerProcess(f"pool-{w}")
        await proc.start(self._require_group())
        self.procs[w] = proc
        self._defined[w] = set()
        return proc

    async def open_app(
        self, app_id: str, spec: AppSpec, units: Sequence[Unit], code_ids: Collection[str]
    ) -> None:
        """Start the workers and define the app in each before its sources start."""
        await super().open_app(app_id, spec, units, code_ids)
        await asyncio.gather(*(self._define_on(w, app_id) for w in range(self.config.workers)))

    async def _define_on(self, w: int, app_id: str) -> None:
        proc = await self._worker(w)
        if app_id not in self._defined[w]:
            self._defined[w].add(app_id)
            await proc.call(self._define(app_id))

    async def add_unit(self, unit: Unit) -> None:
        await super().add_unit(unit)
        await self._tell_workers(unit, unit.ops)

    async def drop_unit(self, unit: Unit) -> None:
        self.dispatcher.cancel(unit)
        await super().drop_unit(unit)
        await self._tell_workers(unit, None)

    async def _tell_workers(self, unit: Unit, ops: list[str] | None) -> None:
        for w, proc in enumerate(list(self.procs)):
            if proc is not None and proc.alive and unit.app_id in self._defined[w]:
                with contextlib.suppress(WorkerDied):
                    await proc.call(("unit", unit.app_id, unit.uid, ops))

    async def close_app(self, app_id: str) -> None:
        for w, proc in enumerate(list(self.procs)):
            if proc is not None and proc.alive and app_id in self._defined[w]:
                self._defined[w].discard(app_id)
                with contextlib.suppress(WorkerDied):
                    await proc.call(("drop", app_id))
        for u in self.units_of(app_id):
            self.dispatcher.cancel(u)
        await super().close_app(app_id)

    async def aclose(self) -> None:
        for proc in self.procs:
            if proc is not None:
                await proc.close()

    def info(self) -> dict[str, Any]:
        return {
            **super().info(),
            "pids": [None if p is None else p.pid for p in self.procs],
            "turns": [0 if p is None else p.turns for p in self.procs],
            "busy": [None if p is None else round(p.busy_s / p.age_s, 4) for p in self.procs],
            "migrations": self.migrations,
            "waiting": len(self.dispatcher.waiting),
            "running": len(self.dispatcher.running),
        }


class ProcessEngine(Engine):
    """One process per operator instance (``os``), prioritised by Lachesis (``lachesis``)."""

    def __init__(self, config: EngineConfig, cache_dir: Path, *, rng: random.Random) -> None:
        super().__init__(config, cache_dir)
        self.controller: LachesisController | None = None
        self._control: asyncio.Task[None] | None = None
        if config.scheduler == "lachesis":
            self.controller = LachesisController(
                config.policy, sample=self._loads, period_s=config.period_s, rng=rng
            )

    def start(self, group: asyncio.TaskGroup) -> None:
        super().start(group)
        if self.controller is not None:
            self._control = group.create_task(self.controller.run(), name="lachesis")

    async def open_app(
        self, app_id: str, spec: AppSpec, units: Sequence[Unit], code_ids: Collection[str]
    ) -> None:
        await super().open_app(app_id, spec, units, code_ids)
        if self.offload_s == 0:  # every unit goes to its process: start them all now
            await asyncio.gather(*(self._process(u) for u in units))

    async def _process(self, unit: Unit) -> WorkerProcess:
        """The unit's own process, started (and the app defined in it) on first use."""
        if unit.process is None:
            proc = unit.process = WorkerProcess(f"{unit.app_id}/{'+'.join(unit.ops)}")
            await proc.start(self._require_group())
            await proc.call(self._define(unit.app_id))
        return unit.process

    async def run(self, unit: Unit, kind: str, producer: str, what: Any) -> list[Emission]:
        proc = await self._process(unit)
        out, stats, unit.service_s = await proc.call(
            (kind, unit.app_id, unit.uid, producer, what, unit.take_handover())
        )
        unit.wait_s = 0.0
        unit.add_stats(stats)
        return out  # type: ignore[no-any-return]

    async def _take_state(self, unit: Unit) -> dict[str, bytes] | None:
        if unit.process is None:
            return None
        state, _, _ = await unit.process.call(("export", unit.app_id, unit.uid))
        return state  # type: ignore[no-any-return]

    async def drop_unit(self, unit: Unit) -> None:
        await super().drop_unit(unit)
        if unit.process is not None:
            await unit.process.close()
            unit.process = None

    async def close_app(self, app_id: str) -> None:
        for u in self.units_of(app_id):
            if u.process is not None:
                await u.process.close()
        await super().close_app(app_id)

    async def aclose(self) -> None:
        if self._control is not None:
            self._control.cancel()
        if self.controller is not None:
            self.controller.close()
        for u in list(self.units.values()):
            if u.process is not None:
                await u.process.close()

    def _loads(self) -> Sequence[InstanceLoad]:
        now = time.monotonic()
        out = []
        for u in self.units.values():
            pid = None if u.process is None else u.process.pid
            if pid is None or not u.process.alive:  # type: ignore[union-attr]
                continue
            ops = list(u.executor.operators.values())
            fed = sum(op.stats.records_in for op in ops[:1])
            made = sum(op.stats.records_out for op in ops[-1:])
            out.append(
                InstanceLoad(
                    pid=pid,
                    queue=u.queue.pending,
                    oldest_s=u.queue.oldest_s(now),
                    rate=u.queue.rate(now),
                    service_s=u.service_s or None,
                    selectivity=made / fed if fed else 1.0,
                )
            )
        return out

    def info(self) -> dict[str, Any]:
        pids = {
            "+".join(u.ops): u.process.pid for u in self.units.values() if u.process is not None
        }
        out = {**super().info(), "processes": pids}
        if self.controller is not None:
            out["lachesis"] = {
                "policy": self.config.policy,
                "privileged": self.controller.privileged,
            }
        return out


def make_engine(
    config: EngineConfig, cache_dir: Path, *, rng: random.Random | None = None
) -> Engine:
    rng = rng or random.Random()
    if config.workers == 0:
        return InlineEngine(config, cache_dir)
    if config.scheduler in ("edgewise", "random"):
        return PoolEngine(config, cache_dir, rng=rng)
    return ProcessEngine(config, cache_dir, rng=rng)
