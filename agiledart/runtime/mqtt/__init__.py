"""MQTT connectors: a per-peer broker pool, and mqtt sources and sinks built on it.

:mod:`.core` holds the plain parts (options, back-off, payloads, the subscription
table), :mod:`.pool` the connections (the only module that imports ``aiomqtt``),
:mod:`.source` and :mod:`.sink` the connectors a peer runs for an app.

Theory of operation
-------------------
**One connection per broker** (as in Pluto, queries share broker
connections). A :class:`BrokerPool` belongs to a peer; every app on the peer asks it
for a :meth:`~BrokerPool.subscribe` or a :meth:`~BrokerPool.lease`, and it keeps one
MQTT connection per :class:`BrokerOptions` (address, TLS, credentials) for as long as
anyone uses it. Subscriptions are reference-counted per topic filter in a
:class:`SubscriptionTable`: many sources on one filter cost one SUBSCRIBE, the highest
QoS any of them asks for, and the last one leaving sends the UNSUBSCRIBE. Each
filter carries an MQTT 5 subscription identifier: a broker with overlapping filters
(``a/#`` and ``a/b``) sends one copy per filter, each naming its filter, so every
source gets every message exactly once; the copy is then dispatched by wildcard
matching (:func:`~agiledart.app.topics.topic_matches`) among the filters it names
(all filters when it names none).

**Reconnect.** A connection's task connects, (re)subscribes every wanted filter and
reads; when the broker goes away it waits an exponential back-off (0.1 s doubling to
5 s, with jitter, :class:`Backoff`) and tries again, for as long as the connection is
used. Nothing here ever raises into the pool's task group: broker errors are logged
and retried, anything else is logged, counted in ``errors`` and retried.

**Sources** (:class:`MqttSource`) decode each payload (``json`` or ``msgpack``; a bad
one is counted in ``parse_errors``) into a record, optionally mapping fields and
adding the topic, give it a ``ts`` (the payload's, else the arrival wall-clock ms) and
put it in a bounded :class:`~agiledart.dataplane.SourceBuffer` that sheds when full
(a shared connection cannot wait for one slow app). The source hands batches of up to
``batch_size`` records downstream, lingering ``tick_s`` for a batch to fill; with
``count`` it ends after that many records.

**Sinks** (:class:`MqttSink`) queue encoded messages in a bounded buffer (``write``
never blocks); a publisher task (:meth:`MqttSink.run`) sends them, up to
:data:`PUBLISH_WINDOW` side by side. While the broker is away the buffer holds what
comes; what overflows it is dropped, oldest first, and counted in ``dropped``.
Messages whose publish failed go back to the front and are sent again (QoS 1 is
at-least-once). :meth:`MqttSink.drain` waits for the buffer to empty.

**aiomqtt and paho, as used here.** A publish waits for the socket (QoS 0) or the
PUBACK (QoS 1) and is not failed when the connection drops, so :mod:`.pool` races it
against the end of the session; aiomqtt warns about more than 10 pending publishes
(raised: the sink bounds them); its incoming queue is unbounded unless given a size
(bounded, drops counted); it connects in an executor thread (a peer may take a few
seconds to exit while a connect to an unreachable broker hangs). Sockets get
``TCP_NODELAY``; give Mosquitto ``set_tcp_nodelay true`` too, or each PUBACK waits
for a delayed ACK (~40 ms) and QoS 1 crawls.
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
    BrokerLease,
    BrokerPool,
    BrokerPoolStatistics,
    Subscription,
)
from agiledart.runtime.mqtt.sink import MqttSink
from agiledart.runtime.mqtt.source import MqttSource, MqttSourceStatistics

__all__ = [
    "DEFAULT_BROKER",
    "MAX_PAYLOAD",
    "PUBLISH_WINDOW",
    "Backoff",
    "BrokerLease",
    "BrokerOptions",
    "BrokerPool",
    "BrokerPoolStatistics",
    "MqttSink",
    "MqttSource",
    "MqttSourceStatistics",
    "PayloadDecoder",
    "Subscription",
    "SubscriptionTable",
    "encode_payload",
    "parse_broker",
    "plan",
]
