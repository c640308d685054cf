"""Run an app, or a group of its operators, in one process.

:class:`Executor` wires operators in topological order and pushes batches and
watermarks through them depth-first: it is what a peer runs for the operators placed
on it (feed it what arrives from upstream, forward what it emits), and what
:func:`run_local` runs for a whole app. No I/O, no threads: the caller drives it.

:func:`run_local` reads every source to its end, round-robin in batches (source
declaration order), emitting after each batch the source's watermark (bounded
out-of-orderness, ``out_of_order_ms``) and at its end the final watermark, and returns
each sink's records in arrival order. File paths are relative to ``base_dir``; mqtt
sources and unbounded generators (no ``count``) cannot run here.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agiledart.app.errors import ExecutionError
from agiledart.app.functions import Resolver, builtin_resolver
from agiledart.app.graph import topological_order
from agiledart.app.spec import AppSpec, SourceSpec
from agiledart.operators import BoundedOutOfOrderness, Operator, Record, build_operator

if TYPE_CHECKING:  # datasets (numpy) only where sources are read: not in worker processes
    from agiledart.datasets import ParseStats

__all__ = ["Emission", "Executor", "LocalRunner", "run_local", "source_batches"]

#: What an executor emits at its boundary: (producer id, records) or (producer id, wm).
Emission = tuple[str, list[Record] | int]


class Executor:
    """Operators of one app (all, or those named), wired and driven in one process."""

    def __init__(
        self,
        app: AppSpec,
        resolve: Resolver | None = None,
        *,
        operators: Collection[str] | None = None,
        states: Mapping[str, bytes] | None = None,
    ) -> None:
        resolve = resolve or builtin_resolver()
        states = states or {}
        specs = {o.id: o for o in app.operators}
        chosen = set(specs) if operators is None else set(operators)
        if not chosen <= set(specs):
            msg = f"no such operators in {app.name!r}: {sorted(chosen - set(specs))}"
            raise ExecutionError(msg)
        order = [n for n in topological_order(app) if n in chosen]
        self.operators: dict[str, Operator] = {
            n: build_operator(specs[n], resolve, state=states.get(n)) for n in order
        }
        #: producer id -> [(consumer operator, input index, consumer id)] inside the group
        self._edges: dict[str, list[tuple[Operator, int, str]]] = {}
        for n in order:
            for i, src in enumerate(specs[n].inputs):
                self._edges.setdefault(src, []).append((self.operators[n], i, n))
        outside = [o.inputs for o in app.operators if o.id not in chosen]
        outside += [s.inputs for s in app.sinks]
        self.exits: frozenset[str] = frozenset(
            src for inputs in outside for src in inputs if src in self.operators
        )
        #: ids this group consumes from outside it
        self.entries: frozenset[str] = frozenset(s for s in self._edges if s not in chosen)

    def feed(self, upstream: str, records: list[Record]) -> list[Emission]:
        """Deliver a batch from ``upstream`` (a source or an operator outside the group)."""
        out: list[Emission] = []
        if records:
            self._push(upstream, records, out)
        return out

    def watermark(self, upstream: str, wm: int) -> list[Emission]:
        out: list[Emission] = []
        self._push_wm(upstream, wm, out)
        return out

    def _push(self, node: str, records: list[Record], out: list[Emission]) -> None:
        if node in self.exits:
            out.append((node, records))
        for op, idx, consumer in self._edges.get(node, ()):
            res = op.on_batch(idx, records)
            if res:
                self._push(consumer, res, out)

    def _push_wm(self, node: str, wm: int, out: list[Emission]) -> None:
        if node in self.exits:
            out.append((node, wm))
        for op, idx, consumer in self._edges.get(node, ()):
            res, new = op.on_watermark(idx, wm)
            if res:
                self._push(consumer, res, out)
            if new is not None:
                self._push_wm(consumer, new, out)

    def snapshot(self) -> dict[str, bytes]:
        """Every operator's resume state, for ``Executor(..., states=...)``."""
        return {n: op.snapshot() for n, op in self.operators.items()}


def source_batches(
    source: SourceSpec,
    *,
    batch_size: int = 1024,
    base_dir: str | os.PathLike[str] | None = None,
    stats: ParseStats | None = None,
) -> Iterator[list[Record]]:
    """The records of a finite generator or file source, in batches."""
    from agiledart.datasets import generate_batches, generator_kwargs, read_file

    p = source.params
    if source.connector == "generator":
        if p.get("count") is None:
            msg = f"source {source.id!r} is unbounded (no count); give it params.count"
            raise ExecutionError(msg)
        return generate_batches(p["dataset"], batch_size=batch_size, **generator_kwargs(p))
    if source.connector == "file":
        path = Path(base_dir or ".") / p["path"]
        if not path.is_file():
            msg = f"source {source.id!r}: cannot read {os.fspath(path)!r}"
            raise ExecutionError(msg)
        return _rebatch(read_file(path, p["format"], stats), batch_size)
    msg = f"source {source.id!r}: the {source.connector} connector needs the network runtime"
    raise ExecutionError(msg)


def _rebatch(records: Iterator[Record], size: int) -> Iterator[list[Record]]:
    batch: list[Record] = []
    for r in records:
        batch.append(r)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


class LocalRunner:
    """:func:`run_local` with its parts kept for inspection (operator stats, parse stats)."""

    def __init__(
        self,
        app: AppSpec,
        resolve: Resolver | None = None,
        *,
        batch_size: int = 1024,
        base_dir: str | os.PathLike[str] | None = None,
        on_output: Callable[[str, list[Record]], None] | None = None,
    ) -> None:
        self.app = app
        self.executor = Executor(app, resolve)
        self.batch_size = batch_size
        self.base_dir = base_dir
        self.parse_stats: dict[str, ParseStats] = {}
        self.outputs: dict[str, list[Record]] = {s.id: [] for s in app.sinks}
        self._sinks_of: dict[str, list[str]] = {}
        for s in app.sinks:
            for src in s.inputs:
                self._sinks_of.setdefault(src, []).append(s.id)
        self._emit = on_output or self._collect
        self._ran = False
        #: operator -> the records its errors dropped, with ``on_error: dead_letter``
        #: (``{"type", "message", "record"}``, in order)
        self.dead_letters: dict[str, list[dict[str, Any]]] = {}
        self._keeping = [(n, op) for n, op in self.executor.operators.items() if op.keep_failed]

    def _collect(self, sink: str, records: list[Record]) -> None:
        self.outputs[sink].extend(records)

    def _deliver(self, producer: str, records: list[Record]) -> None:
        for sink in self._sinks_of.get(producer, ()):
            self._emit(sink, records)

    def run(self) -> dict[str, list[Record]]:
        """Read every source to its end; the sinks' records (also in ``outputs``)."""
        if self._ran:
            msg = "a LocalRunner runs once; make a new one"
            raise ExecutionError(msg)
        self._ran = True
        ex = self.executor
        live: list[tuple[str, Iterator[list[Record]], BoundedOutOfOrderness]] = []
        from agiledart.datasets import ParseStats

        for s in self.app.sources:
            stats = self.parse_stats.setdefault(s.id, ParseStats())
            it = source_batches(s, batch_size=self.batch_size, base_dir=self.base_dir, stats=stats)
            live.append((s.id, it, BoundedOutOfOrderness(s.params["out_of_order_ms"])))
        while live:
            for entry in list(live):
                sid, it, wmgen = entry
                batch = next(it, None)
                if batch is None:
                    live.remove(entry)
                    self._handle(ex.watermark(sid, wmgen.finish()))
                    continue
                self._deliver(sid, batch)
                self._handle(ex.feed(sid, batch))
                wm = wmgen.observe(batch)
                if wm is not None:
                    self._handle(ex.watermark(sid, wm))
        return self.outputs

    def _handle(self, emitted: list[Emission]) -> None:
        for name, op in self._keeping:
            if op.stats.failed:
                self.dead_letters.setdefault(name, []).extend(op.stats.failed)
                op.stats.failed = []
        for producer, what in emitted:
            if isinstance(what, list):
                self._deliver(producer, what)


def run_local(
    app: AppSpec,
    resolve: Resolver | None = None,
    *,
    batch_size: int = 1024,
    base_dir: str | os.PathLike[str] | None = None,
    on_output: Callable[[str, list[Record]], None] | None = None,
) -> dict[str, list[Record]]:
    """Run a finite app to completion in this process: ``{sink id: records}``.

    ``resolve`` defaults to the built-in library only. With ``on_output``, sink
    batches go to ``on_output(sink_id, records)`` instead of being collected.
    """
    runner = LocalRunner(
        app, resolve, batch_size=batch_size, base_dir=base_dir, on_output=on_output
    )
    return runner.run()
