"""The MQTT connectors' plain parts: broker options, reconnect back-off, payload
codecs, and the subscription table with the requests that keep a broker in step with
it. No I/O here (:mod:`.pool` drives the table over a real connection).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import ssl
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack

from agiledart.app.errors import DataError, ExecutionError
from agiledart.app.topics import filter_problem, topic_matches
from agiledart.operators import Record
from agiledart.runtime.connectors import json_line

__all__ = [
    "DEFAULT_BROKER",
    "MAX_PAYLOAD",
    "Backoff",
    "BrokerOptions",
    "BrokerPoolStatistics",
    "Deliver",
    "PayloadDecoder",
    "SubscriptionTable",
    "encode_payload",
    "parse_broker",
    "plan",
]

DEFAULT_BROKER = "localhost:1883"
#: Payloads longer than this are bad input (counted, not decoded).
MAX_PAYLOAD = 1 << 20

#: How a subscriber takes a message: ``deliver(topic, payload)``, never blocking.
Deliver = Callable[[str, bytes], None]


# -- options ----------------------------------------------------------------------------


def parse_broker(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too) as ``(host, port)``; ValueError if malformed."""
    host, sep, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        msg = f"a broker is HOST:PORT with a port in 1-65535, got {text!r}"
        raise ValueError(msg)
    return host, int(port)


@dataclass(frozen=True, kw_only=True, slots=True)
class BrokerOptions:
    """Where a broker is and how to log in: one pooled connection per distinct value."""

    host: str = "localhost"
    port: int = 1883
    tls: bool = False
    ca_file: str | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)

    @classmethod
    def from_params(
        cls, params: Mapping[str, Any], *, owner: str, environ: Mapping[str, str] | None = None
    ) -> BrokerOptions:
        """The options of an mqtt source's or sink's params; ExecutionError naming ``owner``
        for a malformed broker, an unset ``password_env`` or an unusable ``ca_file``."""
        env = os.environ if environ is None else environ
        try:
            host, port = parse_broker(str(params.get("broker", DEFAULT_BROKER)))
        except ValueError as exc:
            msg = f"{owner}: {exc}"
            raise ExecutionError(msg) from None
        password = params.get("password")
        var = params.get("password_env")
        if var is not None:
            password = env.get(str(var))
            if password is None:
                msg = f"{owner}: password_env names {var!r}, which is not set on this peer"
                raise ExecutionError(msg)
        options = cls(
            host=host,
            port=port,
            tls=bool(params.get("tls", False)),
            ca_file=params.get("ca_file"),
            username=params.get("username"),
            password=password,
        )
        options.ssl_context(owner)  # a missing or bad CA file fails now, not at connect
        return options

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def ssl_context(self, owner: str = "mqtt") -> ssl.SSLContext | None:
        if not self.tls:
            return None
        try:
            return ssl.create_default_context(cafile=self.ca_file)
        except (OSError, ssl.SSLError) as exc:
            msg = f"{owner}: cannot use ca_file {self.ca_file!r}: {exc}"
            raise ExecutionError(msg) from None


@dataclass(frozen=True, kw_only=True, slots=True)
class Backoff:
    """Reconnect delays: ``initial_s`` doubling up to ``cap_s``, less up to ``jitter``."""

    initial_s: float = 0.1
    cap_s: float = 5.0
    factor: float = 2.0
    jitter: float = 0.2

    def delay(self, attempt: int, rng: random.Random) -> float:
        """Seconds to wait before attempt ``attempt + 1`` (attempts count from 0)."""
        base = min(self.cap_s, self.initial_s * self.factor ** min(attempt, 64))
        return base * (1.0 - self.jitter * rng.random())


@dataclass(slots=True)
class BrokerPoolStatistics:
    """What a pool has done (a peer reports it in ``ring``)."""

    connections: int = 0  #: broker connections in use (one per broker and credentials)
    connected: int = 0  #: of them, connected now
    connects: int = 0  #: successful connects so far
    reconnects: int = 0  #: connects after a connection was lost
    subscriptions: int = 0  #: topic filters held at brokers (one however many sources)
    subscribers: int = 0  #: sources subscribed through the pool
    messages_in: int = 0
    messages_out: int = 0
    dropped: int = 0  #: incoming messages dropped (unused: sources shed and count instead)
    unrouted: int = 0  #: incoming messages no subscriber wanted (any more)
    errors: int = 0  #: refused subscriptions, failed publishes, unexpected errors


# -- payloads ---------------------------------------------------------------------------


def encode_payload(record: Record, fmt: str) -> bytes:
    """A record as a ``json`` (compact, sorted keys) or ``msgpack`` payload."""
    if fmt == "msgpack":
        data: bytes = msgpack.packb(record, use_bin_type=True)
        return data
    return json_line(record).encode("utf-8")


class PayloadDecoder:
    """Payload bytes to a record (DataError when they are not one).

    The payload is a JSON or msgpack map (anything else becomes ``{"value": it}``).
    With ``fields`` (record field -> payload key) the record has those fields (and the
    payload's ``ts``); without, it is the whole map. ``topic_field`` adds the topic.
    ``ts`` must be an integer (an integral float is made one); without one, the
    arrival time (wall-clock ms) is used.
    """

    def __init__(
        self,
        *,
        format: str = "json",
        fields: Mapping[str, str] | None = None,
        topic_field: str | None = None,
        wall_ms: Callable[[], float] = lambda: time.time() * 1000.0,
    ) -> None:
        if format not in ("json", "msgpack"):
            msg = f"unknown payload format {format!r}; use json or msgpack"
            raise ExecutionError(msg)
        self.format = format
        self.fields = dict(fields) if fields else None
        self.topic_field = topic_field
        self._wall_ms = wall_ms

    def _decode(self, payload: bytes) -> Any:
        if len(payload) > MAX_PAYLOAD:
            msg = f"payload of {len(payload)} bytes; the limit is {MAX_PAYLOAD}"
            raise DataError(msg)
        try:
            if self.format == "msgpack":
                return msgpack.unpackb(payload, raw=False)
            return json.loads(payload)
        except Exception as exc:  # any garbage: our error, never theirs
            msg = f"not {self.format}: {type(exc).__name__}: {str(exc)[:200]}"
            raise DataError(msg) from None

    def __call__(self, topic: str, payload: bytes) -> Record:
        value = self._decode(payload)
        if not isinstance(value, dict):
            value = {"value": value}
        elif not all(isinstance(k, str) for k in value):
            msg = "payload map keys must be strings"
            raise DataError(msg)
        if self.fields is None:
            record: Record = value
        else:
            missing = [key for key in self.fields.values() if key not in value]
            if missing:
                msg = f"payload has no {missing[0]!r}"
                raise DataError(msg)
            record = {name: value[key] for name, key in self.fields.items()}
            if "ts" not in record and "ts" in value:
                record["ts"] = value["ts"]
        if self.topic_field is not None:
            record[self.topic_field] = topic
        ts = record.get("ts")
        if ts is None:
            record["ts"] = int(self._wall_ms())
        elif isinstance(ts, float) and ts.is_integer():
            record["ts"] = int(ts)
        elif not isinstance(ts, int) or isinstance(ts, bool):
            msg = f"'ts' must be an integer (ms), got {ts!r}"[:200]
            raise DataError(msg)
        return record


# -- subscriptions, without I/O -----------------------------------------------------------

#: The largest MQTT 5 subscription identifier (a variable byte integer, 3.8.2.1.2).
MAX_SUBSCRIPTION_ID = 268_435_455


def filter_id(topic_filter: str) -> int:
    """The subscription identifier a filter asks for: the same in every session, so the
    messages a resumed session kept for an earlier process are routed by it too."""
    digest = hashlib.sha256(topic_filter.encode("utf-8")).digest()
    return int.from_bytes(digest[:4], "big") % MAX_SUBSCRIPTION_ID + 1


@dataclass(slots=True)
class _Filter:
    topic_filter: str
    sub_id: int  #: MQTT 5 subscription identifier, unique on its connection
    subscribers: dict[int, tuple[int, Deliver]] = field(default_factory=dict)

    @property
    def qos(self) -> int:
        return max(q for q, _ in self.subscribers.values())


class SubscriptionTable:
    """Who wants which topic filter at what QoS; which subscribers get a message.

    Sans-IO: :meth:`wanted` is what the broker should hold, :func:`plan` the
    SUBSCRIBE and UNSUBSCRIBE requests that get it there, :meth:`route` the dispatch.
    """

    def __init__(self) -> None:
        self._filters: dict[str, _Filter] = {}
        self._by_id: dict[int, _Filter] = {}
        self._next_key = 1
        self.version = 0  #: changes whenever a subscriber comes or goes

    def __len__(self) -> int:
        """Subscribers, over every filter."""
        return sum(len(f.subscribers) for f in self._filters.values())

    def add(self, topic_filter: str, qos: int, deliver: Deliver) -> int:
        """Register a subscriber; the key to :meth:`remove` it with."""
        bad = filter_problem(topic_filter)
        if bad is not None:
            msg = f"bad topic filter {topic_filter!r}: {bad}"
            raise ExecutionError(msg)
        if qos not in (0, 1):
            msg = f"qos must be 0 or 1, got {qos!r}"
            raise ExecutionError(msg)
        f = self._filters.get(topic_filter)
        if f is None:
            sub_id = filter_id(topic_filter)
            while sub_id in self._by_id:  # a collision (rare): the next free one
                sub_id = sub_id % MAX_SUBSCRIPTION_ID + 1
            f = self._filters[topic_filter] = _Filter(topic_filter, sub_id)
            self._by_id[f.sub_id] = f
        key = self._next_key
        self._next_key += 1
        f.subscribers[key] = (qos, deliver)
        self.version += 1
        return key

    def remove(self, topic_filter: str, key: int) -> bool:
        """Drop a subscriber; True when it was the filter's last one."""
        f = self._filters.get(topic_filter)
        if f is None or f.subscribers.pop(key, None) is None:
            return False
        self.version += 1
        if f.subscribers:
            return False
        del self._filters[topic_filter]
        del self._by_id[f.sub_id]
        return True

    def wanted(self) -> dict[str, tuple[int, int]]:
        """``{filter: (qos, subscription id)}`` the broker should hold."""
        return {t: (f.qos, f.sub_id) for t, f in self._filters.items()}

    def route(self, topic: str, sub_ids: Sequence[int] | None = None) -> list[Deliver]:
        """Subscribers a message on ``topic`` goes to; ``sub_ids``: the filters the
        broker says it matched (None or empty: any filter may have)."""
        if sub_ids:
            filters = [self._by_id[i] for i in dict.fromkeys(sub_ids) if i in self._by_id]
        else:
            filters = list(self._filters.values())
        return [
            deliver
            for f in filters
            if topic_matches(f.topic_filter, topic)
            for _, deliver in f.subscribers.values()
        ]


def plan(
    wanted: Mapping[str, tuple[int, int]],
    granted: Mapping[str, tuple[int, int]],
    refused: Mapping[str, str] | None = None,
) -> tuple[list[tuple[str, int, int]], list[str]]:
    """``(subscribe [(filter, qos, id)], unsubscribe [filter])`` taking the broker's
    ``granted`` subscriptions to ``wanted``; filters the broker ``refused`` are not
    asked for again."""
    refused = refused or {}
    subscribe = [
        (t, qos, sid)
        for t, (qos, sid) in wanted.items()
        if granted.get(t) != (qos, sid) and t not in refused
    ]
    unsubscribe = [t for t in granted if t not in wanted]
    return subscribe, unsubscribe
