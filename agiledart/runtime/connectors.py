"""Source and sink connectors of a peer: replay a source in real time, write a sink.

Theory of operation. A :class:`Source` replays a generator or file source at its
``rate`` records per second of wall time, on a :class:`ReplaySchedule`: record ``i``
(0-based) is due ``i / rate`` seconds after the replay starts, so by time ``t`` the
first ``floor(rate * t) + 1`` records are due. The replay loop hands downstream
whatever is due, at most ``batch_size`` records per ``await emit(batch)``; when nothing
is due it sleeps until the next record is, but never less than ``tick_s`` (so a fast
source wakes at most ``1 / tick_s`` times a second and emits what piled up). A file
source without a ``rate`` is unpaced: every record is due at once.

``emit`` may block (back-pressure from the data plane); the source then falls behind
its schedule and, not sleeping while behind, catches up as fast as ``emit`` lets it.
Each record handed downstream (``emit`` returned) more than ``late_ms`` after it was
due counts once in ``delayed``. With ``overload="shed"`` the source instead skips the
records due more than ``max_lag_s`` ago (counted in ``shed``, never handed on), so the
stream stays close to real time at the cost of completeness. The record iterator is
read one batch at a time (a generator makes its records in chunks of
:data:`agiledart.datasets.CHUNK`), so memory stays bounded whatever the stream length.

A :class:`Sink` takes batches of records: ``file`` sinks write JSONL or CSV, buffered
until :meth:`~Sink.flush`; the ``stdout`` sink writes JSONL lines to a stream. JSON has
no bytes and no NaN: bytes values become hex strings, non-finite floats ``null``.
Failures become :class:`~agiledart.app.errors.ExecutionError` naming the node. A file
sink resumed from a checkpoint keeps the bytes its last committed epoch had and drops
the rest; a file *shorter* than that lost committed output (truncated or removed behind
the peer's back) and is refused (:class:`SinkOutputLost`), never padded.

On a peer, every connector is made under the peer's
:class:`~agiledart.runtime.confine.DataPolicy` (``policy``): file paths inside its data
root or allowed folders, ``password_env`` among the variables specs may read; a spec
reaching further is refused as the connector is made, that is when the app deploys.

``mqtt`` sources and sinks live in :mod:`agiledart.runtime.mqtt` and need the peer's
:class:`~agiledart.runtime.mqtt.BrokerPool`: :func:`open_source` and :func:`open_sink`
make them when given one.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import io
import json
import math
import os
import sys
import time
from collections.abc import Awaitable, Callable, Generator, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol, TextIO

from agiledart.app.errors import ExecutionError
from agiledart.app.spec import SinkSpec, SourceSpec
from agiledart.local.executor import source_batches
from agiledart.operators import Record

if TYPE_CHECKING:
    from agiledart.runtime.confine import DataPolicy
    from agiledart.runtime.mqtt import BrokerPool

__all__ = [
    "OVERLOAD_POLICIES",
    "FileSink",
    "ReplaySchedule",
    "Sink",
    "SinkOutputLost",
    "SinkStatistics",
    "Source",
    "SourceConnector",
    "SourceStatistics",
    "StdoutSink",
    "json_line",
    "open_sink",
    "open_source",
]

OVERLOAD_POLICIES = ("block", "shed")
_MQTT = "the mqtt connector needs the peer's broker pool (agiledart.runtime.mqtt)"
#: Slack, in records, for float rounding in the schedule (a record due "now" is due).
_EPS = 1e-6


class SinkOutputLost(ExecutionError):
    """A file sink to resume holds less than its committed checkpoint wrote: output
    that was committed is gone, so the sink refuses to resume rather than pad it."""


@dataclass(frozen=True, slots=True)
class ReplaySchedule:
    """When each record is due: record ``i`` at ``start + i / rate`` (``rate`` None: now)."""

    start: float
    rate: float | None

    def due(self, now: float) -> int:
        """How many records are due by ``now``."""
        if self.rate is None:
            return sys.maxsize
        return max(0, math.floor((now - self.start) * self.rate + _EPS) + 1)

    def due_at(self, i: int) -> float:
        """When record ``i`` is due."""
        return self.start if self.rate is None else self.start + i / self.rate

    def overdue(self, now: float, lag: float) -> int:
        """How many records were due more than ``lag`` seconds before ``now``."""
        if self.rate is None:
            return 0
        return max(0, math.ceil((now - lag - self.start) * self.rate - _EPS))


@dataclass(slots=True)
class SourceStatistics:
    """What a source has done so far (a peer reports it in ``status``)."""

    emitted: int = 0
    delayed: int = 0
    shed: int = 0
    batches: int = 0
    parse_errors: int = 0
    finished: bool = False


class SourceConnector(Protocol):
    """What a peer runs for a source: :class:`Source`, or an mqtt source."""

    @property
    def spec(self) -> SourceSpec: ...

    @property
    def stats(self) -> SourceStatistics: ...

    async def run(self, emit: Callable[[list[Record]], Awaitable[None]]) -> None:
        """Hand every record to ``emit`` (which may block); return when they end."""
        ...


def open_source(
    spec: SourceSpec,
    *,
    base_dir: str | os.PathLike[str],
    overload: str = "block",
    brokers: BrokerPool | None = None,
    skip: int = 0,
    policy: DataPolicy | None = None,
    app_id: str | None = None,
    checkpointed: bool = False,
    state_dir: str | os.PathLike[str] | None = None,
    replay: list[Any] | None = None,
) -> SourceConnector:
    """The source ``spec`` describes; an mqtt source subscribes through ``brokers``
    and keeps its log under their ``log_root`` or ``base_dir/mqtt/`` (a checkpointed
    app's: the same log for every generation of app ``app_id``, read on from position
    ``skip``, dropping the broker's redeliveries ``replay`` names); an http source
    listens on its port and logs under ``state_dir/http/`` (a checkpointed app's: the
    same log for every generation, read on from ``skip``). A replayable one (generator,
    file) starts after its first ``skip`` records. With ``policy`` (a peer's), a spec
    reaching past it is refused."""
    if spec.connector == "mqtt" and brokers is not None:
        from agiledart.runtime.mqtt import MqttSource, source_log_dir  # mqtt imports us

        _check_env(spec.params, f"source {spec.id!r}", policy)
        durable = checkpointed and app_id is not None
        root = brokers.log_root or Path(base_dir) / "mqtt"
        log_dir = source_log_dir(root, app_id if durable else None, spec.id)
        return MqttSource(
            spec,
            brokers=brokers,
            log_dir=log_dir,
            durable=durable,
            start=skip,
            replay=replay,
        )
    if spec.connector == "http":
        from agiledart.runtime.http import HttpSource, http_log_dir  # http imports us

        if policy is not None:
            policy.check_env(
                f"source {spec.id!r}", str(spec.params["token_env"]), param="token_env"
            )
        durable = checkpointed and app_id is not None
        root = Path(state_dir if state_dir is not None else base_dir) / "http"
        log_dir = http_log_dir(root, app_id if durable else None, spec.id)
        return HttpSource(spec, log_dir=log_dir, durable=durable, start=skip)
    return Source(spec, base_dir=base_dir, overload=overload, skip=skip, policy=policy)


def _check_env(params: Mapping[str, Any], owner: str, policy: DataPolicy | None) -> None:
    """Refuse an mqtt connector's ``password_env`` that ``policy`` does not allow."""
    var = params.get("password_env")
    if policy is not None and var is not None:
        policy.check_env(owner, str(var))


class Source:
    """Replays a generator or file source in real time at its ``rate``."""

    def __init__(
        self,
        spec: SourceSpec,
        *,
        base_dir: str | os.PathLike[str],
        batch_size: int = 1000,
        tick_s: float = 0.005,
        overload: str = "block",
        max_lag_s: float = 1.0,
        late_ms: float = 100.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        skip: int = 0,
        policy: DataPolicy | None = None,
    ) -> None:
        if spec.connector == "mqtt":
            msg = f"source {spec.id!r}: {_MQTT}"
            raise ExecutionError(msg)
        if spec.connector not in ("generator", "file"):
            msg = f"source {spec.id!r}: unknown connector {spec.connector!r}"
            raise ExecutionError(msg)
        if overload not in OVERLOAD_POLICIES:
            msg = f"overload must be one of {', '.join(OVERLOAD_POLICIES)}, got {overload!r}"
            raise ExecutionError(msg)
        if batch_size < 1 or not tick_s > 0 or max_lag_s < 0 or late_ms < 0:
            msg = "need batch_size >= 1, tick_s > 0, max_lag_s >= 0 and late_ms >= 0"
            raise ExecutionError(msg)
        if spec.connector == "file" and policy is not None:
            base_dir = policy.root
            policy.source_path(f"source {spec.id!r}", spec.params["path"])
        self.spec = spec
        self.stats = SourceStatistics()
        from agiledart.datasets import ParseStats  # numpy: only where sources run

        self.parse_stats = ParseStats()
        self._base_dir = Path(base_dir)
        self._batch_size = batch_size
        self._tick_s = tick_s
        self._shed = overload == "shed"
        self._max_lag_s = max_lag_s
        self._late_s = late_ms / 1000
        self._clock = clock
        self._sleep = sleep
        rate = spec.params.get("rate")
        speedup = float(spec.params.get("speedup", 1.0))
        self.rate: float | None = None if rate is None else float(rate) * speedup
        self._started = False
        self._skip = max(0, skip)  #: records already emitted before a restore

    def _batches(self) -> Iterator[list[Record]]:
        p = self.spec.params
        if self.spec.connector == "generator":
            from agiledart.datasets import chunk_size, generate_batches, generator_kwargs

            kwargs = generator_kwargs(p)
            # a slow stream is made a chunk at a time: hold no more than that
            batch = min(self._batch_size, chunk_size(p["rate"]))
            return generate_batches(p["dataset"], batch_size=batch, **kwargs)
        return source_batches(
            self.spec,
            batch_size=self._batch_size,
            base_dir=self._base_dir,
            stats=self.parse_stats,
        )

    async def run(self, emit: Callable[[list[Record]], Awaitable[None]]) -> None:
        """Hand every record to ``emit`` on schedule; return when the records end.

        Runs once. Cancelling it stops the replay and closes the input.
        """
        if self._started:
            msg = f"source {self.spec.id!r} runs once; make a new Source"
            raise ExecutionError(msg)
        self._started = True
        batches = self._batches()
        try:
            await self._replay(batches, emit)
        finally:
            if isinstance(batches, Generator):
                batches.close()

    async def _replay(
        self, batches: Iterator[list[Record]], emit: Callable[[list[Record]], Awaitable[None]]
    ) -> None:
        st = self.stats
        schedule = ReplaySchedule(self._clock(), self.rate)
        position = 0  # index of pending[0] in the stream
        pending: list[Record] = []
        skip = self._skip  # a restored source resumes after what it had emitted
        while skip > 0:
            nxt = next(batches, None)
            if nxt is None:
                break
            if len(nxt) > skip:
                pending = nxt[skip:]
            skip -= min(skip, len(nxt))
        st.emitted = self._skip - skip
        while True:
            if not pending:
                nxt = next(batches, None)
                st.parse_errors = self.parse_stats.bad
                if nxt is None:
                    st.finished = True
                    return
                pending = nxt
                continue
            now = self._clock()
            if self._shed:
                skip = min(len(pending), schedule.overdue(now, self._max_lag_s) - position)
                if skip > 0:
                    del pending[:skip]
                    position += skip
                    st.shed += skip
                    continue
            due = schedule.due(now) - position
            if due <= 0:
                await self._sleep(max(self._tick_s, schedule.due_at(position) - now))
                continue
            n = min(due, self._batch_size, len(pending))
            batch = pending[:n]
            del pending[:n]
            await emit(batch)
            late = schedule.overdue(self._clock(), self._late_s) - position
            st.delayed += min(n, max(0, late))
            position += n
            st.emitted += n
            st.batches += 1
            await asyncio.sleep(0)  # let others run (and cancel us) when emit never waits


@dataclass(slots=True)
class SinkStatistics:
    """What a sink has written (records, batches, encoded bytes) and what it could not:
    records ``dropped`` (an mqtt sink's buffer overflowed) and ``errors`` (records that
    cannot be written, e.g. with no field for the topic)."""

    records: int = 0
    batches: int = 0
    bytes: int = 0
    dropped: int = 0
    errors: int = 0


class Sink(Protocol):
    """Where a sink's records go; :func:`open_sink` makes one from its spec."""

    @property
    def stats(self) -> SinkStatistics: ...

    @property
    def path(self) -> Path | None:
        """The file written, or None (stdout)."""
        ...

    def write(self, records: list[Record]) -> None: ...

    def flush(self) -> None:
        """Make everything written so far visible to readers."""
        ...

    def close(self) -> None:
        """Flush and close; closing again does nothing."""
        ...


def _plain(value: Any) -> Any:
    """JSON's ``default``: bytes as hex, numpy values as Python ones, else ``str``."""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, set | frozenset):
        return sorted(value, key=repr)
    return str(value)


def _finite(value: Any) -> Any:
    """``value`` with every non-finite float (nested too) made None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    if hasattr(value, "tolist"):
        return _finite(value.tolist())
    return value


def json_line(value: Any) -> str:
    """One compact JSON line (sorted keys, no newline); bytes hex, NaN and inf null."""
    try:
        return json.dumps(
            value, separators=(",", ":"), sort_keys=True, allow_nan=False, default=_plain
        )
    except ValueError:
        return json.dumps(
            _finite(value), separators=(",", ":"), sort_keys=True, allow_nan=False, default=_plain
        )


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else ""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    return json_line(value)


class FileSink:
    """A ``file`` sink: JSONL or CSV (header: the first record's keys, sorted)."""

    def __init__(
        self,
        spec: SinkSpec,
        *,
        out_dir: str | os.PathLike[str],
        resume: Mapping[str, Any] | None = None,
        policy: DataPolicy | None = None,
        append: bool = False,
    ) -> None:
        """``append``: add to what the file holds (a dead-letter file) instead of
        starting it empty."""
        self.id = spec.id
        self.format: str = spec.params.get("format", "jsonl")
        if self.format not in ("jsonl", "csv"):
            msg = f"sink {spec.id!r}: unknown file format {self.format!r}; use jsonl or csv"
            raise ExecutionError(msg)
        if policy is None:
            self.path: Path = Path(out_dir) / spec.params["path"]
        else:
            self.path = policy.sink_path(f"sink {spec.id!r}", spec.params["path"], out_dir)
        self.stats = SinkStatistics()
        self._columns: list[str] | None = None
        self._closed = False
        #: written records reach the file (the OS) within this long: a low-rate sink's
        #: output shows while the app runs, not only at its end (0: after every batch)
        self.flush_s = int(spec.params.get("flush_ms", 1000)) / 1000.0
        self._flush_timer: asyncio.TimerHandle | None = None
        with self._errors("cannot write"):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if resume is None:
                mode = "ab" if append else "wb"
                self._file: IO[bytes] = open(self.path, mode)  # noqa: SIM115 - closed in close()
            else:  # a restored app: keep what the last committed epoch had, drop the rest
                self._file = self._resume(int(resume["size"]))
                self.stats.records = int(resume.get("records", 0))
                if self.format == "csv" and self._file.tell():
                    self._file.seek(0)
                    head = self._file.readline().decode("utf-8").rstrip("\n")
                    self._columns = next(csv.reader([head]))
                    self._file.seek(0, os.SEEK_END)

    def _resume(self, size: int) -> IO[bytes]:
        """The file opened at the end of its first ``size`` bytes (the committed ones),
        what came after them dropped; SinkOutputLost when it holds fewer."""
        f = open(self.path, "r+b" if self.path.exists() else "w+b")  # noqa: SIM115
        try:
            held = f.seek(0, os.SEEK_END)
            if held < size:
                msg = (
                    f"sink {self.id!r}: {os.fspath(self.path)!r} holds {held} bytes, but the "
                    f"checkpoint to resume from committed {size}: output already written is "
                    "lost (the file was truncated or removed); refusing to resume over it"
                )
                raise SinkOutputLost(msg)
            f.truncate(size)
            f.seek(0, os.SEEK_END)
        except BaseException:
            f.close()
            raise
        return f

    def commit(self) -> dict[str, int]:
        """What an epoch's end makes durable: everything written so far."""
        with self._errors("cannot write"):
            self._file.flush()
            os.fsync(self._file.fileno())
            return {"size": self._file.tell(), "records": self.stats.records}

    @contextlib.contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        try:
            yield
        except OSError as e:
            msg = f"sink {self.id!r}: {what} {os.fspath(self.path)!r}: {e.strerror or e}"
            raise ExecutionError(msg) from e

    def _encode(self, records: list[Record]) -> str:
        if self.format == "jsonl":
            return "".join(json_line(r) + "\n" for r in records)
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        if self._columns is None:
            self._columns = sorted(records[0])
            writer.writerow(self._columns)
        cols = self._columns
        writer.writerows([_cell(r.get(c)) for c in cols] for r in records)
        return out.getvalue()

    def write(self, records: list[Record]) -> None:
        if self._closed:
            msg = f"sink {self.id!r} is closed"
            raise ExecutionError(msg)
        if not records:
            return
        data = self._encode(records).encode("utf-8")
        with self._errors("cannot write"):
            self._file.write(data)
        self.stats.records += len(records)
        self.stats.batches += 1
        self.stats.bytes += len(data)
        self._flush_soon()

    def _flush_soon(self) -> None:
        """Flush within :attr:`flush_s` (now when 0, or outside an event loop)."""
        if self._flush_timer is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is None or self.flush_s <= 0:
            self.flush()
            return
        self._flush_timer = loop.call_later(self.flush_s, self._flush_due)

    def _flush_due(self) -> None:
        self._flush_timer = None
        with contextlib.suppress(ExecutionError):  # the next write or commit says why
            self.flush()

    def flush(self) -> None:
        if not self._closed:
            with self._errors("cannot write"):
                self._file.flush()

    def close(self) -> None:
        if self._closed:
            return
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None
        self._closed = True
        with self._errors("cannot write"):
            self._file.close()


class StdoutSink:
    """The ``stdout`` sink: JSONL lines to a text stream (default ``sys.stdout``)."""

    path: Path | None = None

    def __init__(self, spec: SinkSpec, *, stream: TextIO | None = None) -> None:
        self.id = spec.id
        self.stats = SinkStatistics()
        self._stream = stream if stream is not None else sys.stdout
        self._closed = False

    def write(self, records: list[Record]) -> None:
        if self._closed:
            msg = f"sink {self.id!r} is closed"
            raise ExecutionError(msg)
        if not records:
            return
        text = "".join(json_line(r) + "\n" for r in records)
        self._stream.write(text)
        self.stats.records += len(records)
        self.stats.batches += 1
        self.stats.bytes += len(text.encode("utf-8"))

    def flush(self) -> None:
        if not self._closed:
            self._stream.flush()

    def close(self) -> None:
        """Flush; the stream stays open (it is not ours)."""
        if not self._closed:
            self._stream.flush()
            self._closed = True


class DiscardSink:
    """The ``discard`` sink: counts records and drops them (benchmarks, dry runs)."""

    path: Path | None = None

    def __init__(self, spec: SinkSpec) -> None:
        self.id = spec.id
        self.stats = SinkStatistics()

    def write(self, records: list[Record]) -> None:
        if records:
            self.stats.records += len(records)
            self.stats.batches += 1

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def open_sink(
    spec: SinkSpec,
    *,
    out_dir: str | os.PathLike[str],
    stdout: TextIO | None = None,
    brokers: BrokerPool | None = None,
    resume: Mapping[str, Any] | None = None,
    policy: DataPolicy | None = None,
    app: tuple[str, str, bool] = ("", "", False),
) -> Sink:
    """The sink ``spec`` describes; a relative file ``path`` is under ``out_dir``; an
    mqtt sink publishes through ``brokers`` (its owner runs its publisher). A file sink
    given ``resume`` (a committed ``size`` and ``records``) keeps that much, an sql or
    http sink (its committed ``epoch``) sends what it holds up to it. ``app``: the app
    id, the peer's name and whether the app checkpoints (an sql, http or mqtt sink's).
    With ``policy`` (a peer's), a spec reaching past it is refused."""
    if spec.connector == "file":
        return FileSink(spec, out_dir=out_dir, resume=resume, policy=policy)
    if spec.connector == "stdout":
        return StdoutSink(spec, stream=stdout)
    if spec.connector == "discard":
        return DiscardSink(spec)
    if spec.connector == "mqtt":
        if brokers is None:
            msg = f"sink {spec.id!r}: {_MQTT}"
            raise ExecutionError(msg)
        from agiledart.runtime.mqtt import MqttEpochSink, MqttSink  # mqtt imports this

        _check_env(spec.params, f"sink {spec.id!r}", policy)
        app_id, instance, checkpointed = app
        if checkpointed and spec.params.get("delivery") == "exactly-once":  # with ids
            return MqttEpochSink(
                spec, brokers=brokers, app_id=app_id, instance=instance,
                out_dir=Path(out_dir), resume=resume,
            )  # fmt: skip
        return MqttSink(spec, brokers=brokers)
    if spec.connector in ("sql", "http"):
        from agiledart.runtime.http import HttpSink  # both import this module
        from agiledart.runtime.sql import SqlSink

        app_id, instance, checkpointed = app
        return (SqlSink if spec.connector == "sql" else HttpSink)(
            spec,
            app_id=app_id,
            instance=instance,
            out_dir=Path(out_dir),
            checkpointed=checkpointed,
            resume=resume,
            policy=policy,
        )
    msg = f"sink {spec.id!r}: unknown connector {spec.connector!r}"
    raise ExecutionError(msg)
