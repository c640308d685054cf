"""MQTT connectors: a per-peer broker pool, and mqtt sources and sinks built on it.

:mod:`.core` holds the plain parts (options, back-off, payloads, the subscription
table), :mod:`.wire` the MQTT 5 packets a subscriber exchanges (no I/O),
:mod:`.ingest` the subscribing connection that drives them, :mod:`.worker` the
ingest process it runs in, :mod:`.log` the sources' logs, :mod:`.acks` the
acknowledgements a checkpointed source holds until its epochs commit, :mod:`.subscriptions` the
peer's side of the ingest processes, :mod:`.pool` the pool and its publishing
connections (the only module that imports ``aiomqtt``), :mod:`.source` and
:mod:`.sink` the connectors a peer runs for an app.

Theory of operation
-------------------
**Per broker, one ingest process and one publishing connection** (as in Pluto,
queries share broker connections). A :class:`BrokerPool`
belongs to a peer; every app on the peer asks it for a :meth:`~BrokerPool.subscribe_log`
or a :meth:`~BrokerPool.lease`, and it keeps them for as long as anyone uses them.
Subscriptions are reference-counted per topic filter in a :class:`SubscriptionTable`
(in the ingest process): many sources on one filter cost one SUBSCRIBE, the highest
QoS any of them asks for, and the last one leaving sends the UNSUBSCRIBE. Each filter
carries an MQTT 5 subscription identifier: a broker with overlapping filters (``a/#``
and ``a/b``) sends one copy per filter, each naming its filter, so every source gets
every message exactly once; the copy is dispatched by wildcard matching
(:func:`~agiledart.app.topics.topic_matches`) among the filters it names.

**Ingest at the broker's speed.** Mosquitto sends an MQTT 5 client that states no
Receive Maximum at most ``max_inflight_messages`` (20) unacknowledged QoS 1 messages
and queues ``max_queued_messages`` (1000) more, then drops, uncounted by us. paho
read a packet per readiness event with three ``recv`` calls and wrote each PUBACK
alone, a few thousand messages/s, so a ``mosquitto_pub`` burst overflowed that queue.
Now: the CONNECT states Receive Maximum 65535, so the broker streams the burst instead
of queueing it; a small process per broker (:mod:`.worker`, woken as promptly as
``mosquitto_sub``, whatever the peer's event loop is doing) parses each ``recv`` in one
pass (:mod:`.wire`), appends every message to its sources' logs and writes them in one
group commit, then acknowledges that read's QoS 1 messages in one write. The engine's
backpressure is the log's bound on disk, never the broker's queue: past ``buffer``
messages or ``buffer_mb`` a source sheds and counts it (``shed`` in ``status``, the
``shed`` outcome of the ``source_tuples`` metric, an ``ingest`` trace record).

**Exactly-once through failures** (a checkpointed app's QoS 1 source, wherever it
runs). The log is named by app and source, the same for every generation of the app;
a checkpoint records the source's log position, the log keeps everything from the last
committed epoch's position on, and a restored source reads on from its checkpoint's
position. Between generations the subscription stays (detached) and the ingest
process goes on logging. Such a source has a broker session of its own, not the
peer's: its own ingest process, a client id fixed by app, source and broker (the same
on every peer), clean start off, a session expiry interval; and its QoS 1 messages are
acknowledged only once a committed epoch covers them (:mod:`.acks`). So the broker
holds whatever the peer has not made safe, and a source that moves to another peer
(its peer dead for good; the scheduler moves it like an operator) resumes the session
there: the broker redelivers every unacknowledged message, and the packet ids the
checkpoint recorded tell which of them it already covers (dropped) from the log's tail
(logged from the checkpoint's position on). Why not replicate the log to leaf-set
peers before acknowledging: the broker already keeps an unacknowledged message, in
order, for the session that took it; held acknowledgements make it the replica, with no
round trip across the overlay per group commit and nothing to collect on other peers.
Other sources (QoS 0, or apps without checkpoints) share the peer's ingest connection,
a persistent session per peer and broker (a fixed client id, clean start off), and are
acknowledged once logged. Each filter has the same subscription identifier in every
session.

**Reconnect.** The ingest process and the publishing connection each connect,
(re)subscribe every wanted filter and serve; when the broker goes away they wait an
exponential back-off (0.1 s doubling to 5 s, with jitter, :class:`Backoff`) and try
again. An ingest process that dies is logged, counted in ``errors`` and started again.
Nothing raises into the pool's task group.

**Sources** (:class:`MqttSource`) read their log behind the ingest process, decode each
payload (``json`` or ``msgpack``; a bad one is counted in ``parse_errors``) into a
record, optionally mapping fields and adding the topic, give it a ``ts`` (the
payload's, else the wall-clock ms at decoding) and hand batches of up to
``batch_size`` records downstream, lingering ``tick_s`` for a batch to fill; with
``count`` they end after that many records.

**Sinks** (:class:`MqttSink`) queue encoded messages in a bounded buffer (``write``
never blocks); a publisher task (:meth:`MqttSink.run`) sends them, up to
:data:`PUBLISH_WINDOW` side by side. While the broker is away the buffer holds what
comes; what overflows it is dropped, oldest first, and counted in ``dropped``.
Messages whose publish failed go back to the front and are sent again (QoS 1 is
at-least-once). :meth:`MqttSink.drain` waits for the buffer to empty. In a checkpointed app the sink
is an :class:`MqttEpochSink` instead: two-phase, per committed epoch, with ids (see
:mod:`.sink`).

**aiomqtt and paho, as used here (publishing).** A publish waits for the socket (QoS 0)
or the PUBACK (QoS 1) and is not failed when the connection drops, so :mod:`.pool`
races it against the end of the session; aiomqtt warns about more than 10 pending
publishes (raised: the sink bounds them); it connects in an executor thread (a peer
may take a few seconds to exit while a connect to an unreachable broker hangs).
Sockets get ``TCP_NODELAY``; give Mosquitto ``set_tcp_nodelay true`` too, or each
PUBACK waits for a delayed ACK (~40 ms) and QoS 1 publishing crawls.
"""

from agiledart.runtime.mqtt.core import (
    DEFAULT_BROKER,
    MAX_PAYLOAD,
    Backoff,
    BrokerOptions,
    PayloadDecoder,
    SubscriptionTable,
    encode_payload,
    parse_broker,
    plan,
)
from agiledart.runtime.mqtt.pool import (
    PUBLISH_WINDOW,
    SESSION_EXPIRY_S,
    BrokerLease,
    BrokerPool,
    BrokerPoolStatistics,
    Subscription,
    source_log_dir,
    source_session,
)
from agiledart.runtime.mqtt.sink import MqttEpochSink, MqttSink
from agiledart.runtime.mqtt.source import MqttSource, MqttSourceStatistics

__all__ = [
    "DEFAULT_BROKER",
    "MAX_PAYLOAD",
    "PUBLISH_WINDOW",
    "SESSION_EXPIRY_S",
    "Backoff",
    "BrokerLease",
    "BrokerOptions",
    "BrokerPool",
    "BrokerPoolStatistics",
    "MqttEpochSink",
    "MqttSink",
    "MqttSource",
    "MqttSourceStatistics",
    "PayloadDecoder",
    "Subscription",
    "SubscriptionTable",
    "encode_payload",
    "parse_broker",
    "plan",
    "source_log_dir",
    "source_session",
]
