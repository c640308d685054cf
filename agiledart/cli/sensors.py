"""``agiledart sensors``: a site's sensors, simulated: a dataset published to MQTT live.

The records are those a ``generator`` source with the same dataset, seed and rate
makes (:func:`agiledart.datasets.generate_batches`), replayed at ``--rate`` records
per second of wall time by the peers' own :class:`~agiledart.runtime.connectors.Source`
and published by an :class:`~agiledart.runtime.mqtt.MqttSink`, each record as one
message on the topic its template makes (``sensors/{city}/{metric}`` for ``urban``).
So an app reading the topics sees exactly the records a reference computation over
the same generator parameters sees. While the broker is away the sink's buffer holds
what comes (what overflows it is dropped and counted); progress goes to stderr, a
summary to stdout at the end (``--json``: one JSON object).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from agiledart.app.errors import Problem, SpecError
from agiledart.app.schema import DATASET_PARAMS, SINK_PARAMS, SOURCE_PARAMS, check_params
from agiledart.app.spec import DATASETS, SinkSpec, SourceSpec, freeze
from agiledart.errors import AgiledartError
from agiledart.operators import Record
from agiledart.runtime.connectors import Source
from agiledart.runtime.errors import BrokerError
from agiledart.runtime.mqtt import DEFAULT_BROKER, BrokerPool, MqttSink

__all__ = ["SensorOptions", "SensorSummary", "add_parser", "default_topic", "simulate"]

_TOPICS = {"urban": "sensors/{city}/{metric}", "counter": "sensors/counter/{key}"}


def default_topic(dataset: str) -> str:
    return _TOPICS.get(dataset, f"sensors/{dataset}")


@dataclass(frozen=True, kw_only=True)
class SensorOptions:
    broker: str = DEFAULT_BROKER
    dataset: str = "urban"
    rate: float = 100.0  #: records per second, of wall time and of event time
    count: int | None = None  #: records to publish (None: until interrupted)
    seed: int = 0
    topic: str | None = None  #: template; None: :func:`default_topic`
    qos: int = 0
    format: str = "json"
    buffer: int = 10_000  #: records held while the broker is away
    timeout_s: float = 30.0  #: to reach the broker at the start, to drain at the end
    tls: bool = False
    ca_file: str | None = None
    username: str | None = None
    password_env: str | None = None


@dataclass(frozen=True, kw_only=True)
class SensorSummary:
    broker: str
    topic: str
    generated: int
    published: int
    dropped: int
    errors: int
    elapsed_s: float
    rate: float  #: published records per second

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _specs(o: SensorOptions) -> tuple[SourceSpec, SinkSpec]:
    """The generator source and mqtt sink the options describe, checked like a spec's."""
    problems: list[Problem] = []
    source: dict[str, Any] = {"dataset": o.dataset, "rate": o.rate, "seed": o.seed}
    if o.count is not None:
        source["count"] = o.count
    schema = (*SOURCE_PARAMS["generator"], *DATASET_PARAMS.get(o.dataset, ()))
    source = check_params(source, schema, "sensors", problems, owner="sensors")
    sink: dict[str, Any] = {
        "topic": o.topic or default_topic(o.dataset),
        "broker": o.broker,
        "qos": o.qos,
        "format": o.format,
        "buffer": o.buffer,
        "tls": o.tls,
        "drain_timeout_ms": max(0, int(o.timeout_s * 1000)),
    }
    extra = {"ca_file": o.ca_file, "username": o.username, "password_env": o.password_env}
    sink |= {k: v for k, v in extra.items() if v is not None}
    sink = check_params(sink, SINK_PARAMS["mqtt"], "sensors", problems, owner="sensors")
    if problems:
        raise SpecError(problems)
    return (
        SourceSpec(id="sensors", peer="local", connector="generator", params=freeze(source)),
        SinkSpec(
            id="mqtt", peer="local", connector="mqtt", inputs=("sensors",), params=freeze(sink)
        ),
    )


async def simulate(
    options: SensorOptions,
    *,
    progress: Callable[[str], None] | None = None,
    interval_s: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
) -> SensorSummary:
    """Publish the dataset; the summary once every record is published (or dropped)."""
    source_spec, sink_spec = _specs(options)
    pool = BrokerPool(client_id="agiledart-sensors")
    generated = 0
    started = clock()
    error: AgiledartError | None = None
    async with asyncio.TaskGroup() as group:
        pool.start(group)
        sink = MqttSink(sink_spec, brokers=pool)
        publisher = group.create_task(sink.run())

        def line() -> str:
            took = max(clock() - started, 1e-9)
            state = "connected" if sink.connected else "NOT connected, buffering"
            return (
                f"sensors: {generated} generated, {sink.stats.records} published "
                f"({sink.stats.records / took:.0f}/s), {sink.queued} queued, "
                f"{sink.stats.dropped} dropped; broker {options.broker} {state}"
            )

        async def report() -> None:
            while progress is not None:
                await asyncio.sleep(interval_s)
                progress(line())

        reporter = group.create_task(report())
        try:
            try:
                async with asyncio.timeout(options.timeout_s):
                    await sink.wait_connected()
            except TimeoutError:
                msg = f"cannot reach the MQTT broker {options.broker} in {options.timeout_s:g} s"
                raise BrokerError(msg) from None
            started = clock()

            async def emit(records: list[Record]) -> None:
                nonlocal generated
                generated += len(records)
                sink.write(records)

            await Source(source_spec, base_dir=".").run(emit)
            await sink.drain()
        except AgiledartError as exc:
            error = exc
        finally:
            sink.close()
            publisher.cancel()
            reporter.cancel()
            await pool.aclose()
    if error is not None:
        raise error
    elapsed = clock() - started
    st = sink.stats
    return SensorSummary(
        broker=options.broker,
        topic=str(sink_spec.params["topic"]),
        generated=generated,
        published=st.records,
        dropped=st.dropped,
        errors=st.errors,
        elapsed_s=round(elapsed, 3),
        rate=round(st.records / elapsed, 1) if elapsed > 0 else 0.0,
    )


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "sensors",
        help="publish a generated dataset to an MQTT broker, live",
        description="Simulate a site's sensors: publish the records of a generator "
        "dataset (the records a generator source with the same dataset, seed and rate "
        "makes) to an MQTT broker at --rate records per second, one message per record "
        "on the topic the --topic template makes from it. Progress goes to stderr, a "
        "summary to stdout. Ends after --count records, or on Ctrl-C.",
    )
    p.add_argument("--broker", default=DEFAULT_BROKER, metavar="HOST:PORT")
    p.add_argument("--dataset", default="urban", choices=DATASETS)
    p.add_argument("--rate", type=float, default=100.0, help="records per second (default 100)")
    p.add_argument("--count", type=int, help="records to publish (default: until Ctrl-C)")
    p.add_argument("--seed", type=int, default=0, help="dataset seed (default 0)")
    p.add_argument(
        "--topic",
        metavar="TEMPLATE",
        help="topic template, fields in braces (default for urban: sensors/{city}/{metric})",
    )
    p.add_argument("--qos", type=int, default=0, choices=(0, 1))
    p.add_argument("--format", default="json", choices=("json", "msgpack"))
    p.add_argument(
        "--buffer", type=int, default=10_000, help="records held while the broker is away"
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        help="seconds to wait for the broker at the start and to publish the rest at the end",
    )
    p.add_argument("--tls", action="store_true", help="connect with TLS")
    p.add_argument("--ca-file", help="CA certificates for TLS (default: the system's)")
    p.add_argument("--username")
    p.add_argument("--password-env", metavar="VAR", help="environment variable with the password")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.set_defaults(func=_cmd_sensors)


def _cmd_sensors(args: argparse.Namespace) -> int:
    options = SensorOptions(
        broker=args.broker,
        dataset=args.dataset,
        rate=args.rate,
        count=args.count,
        seed=args.seed,
        topic=args.topic,
        qos=args.qos,
        format=args.format,
        buffer=args.buffer,
        timeout_s=args.timeout,
        tls=args.tls,
        ca_file=args.ca_file,
        username=args.username,
        password_env=args.password_env,
    )

    def to_stderr(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    summary = asyncio.run(simulate(options, progress=to_stderr))
    if args.json:
        print(json.dumps(summary.as_dict()))
    else:
        print(
            f"published {summary.published} of {summary.generated} records to "
            f"{summary.broker} ({summary.topic}) in {summary.elapsed_s:.1f} s "
            f"({summary.rate:.0f}/s); {summary.dropped} dropped, {summary.errors} errors"
        )
    return 0
