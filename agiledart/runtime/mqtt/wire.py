"""The MQTT 5 packets a subscriber exchanges with a broker, without I/O.

:class:`PacketReader` turns the bytes a broker sends into events
(:class:`ConnAck`, :class:`SubAck`, :class:`UnsubAck`, :class:`Publish`,
:class:`PingResp`, :class:`Disconnect`); the ``encode_*`` functions make the packets a
subscriber sends (OASIS MQTT 5.0, section 3). :mod:`.ingest` drives them over a socket.

Why our own: paho reads a packet with three ``recv`` calls and one readiness event,
then writes its PUBACK alone, and builds three objects per message on the way to us;
with Mosquitto's default ``max_inflight_messages 20`` that paced a QoS 1 subscriber at
a few thousand messages/s, below what ``mosquitto_pub`` sends, and the broker's queue
(``max_queued_messages 1000``) overflowed. Here a whole ``recv`` of packets is parsed
in one pass, and their PUBACKs go out in one write.

Every malformed input is a :class:`MqttProtocolError` (the connection is dropped).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import NamedTuple

from agiledart.runtime.errors import BrokerError

__all__ = [
    "PINGREQ",
    "ConnAck",
    "Disconnect",
    "Event",
    "MqttProtocolError",
    "PacketReader",
    "PingResp",
    "Publish",
    "SubAck",
    "UnsubAck",
    "encode_connect",
    "encode_disconnect",
    "encode_pubacks",
    "encode_subscribe",
    "encode_unsubscribe",
]

PINGREQ = b"\xc0\x00"


class MqttProtocolError(BrokerError):
    """The broker sent bytes that are not MQTT 5 a subscriber expects."""


# -- events ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ConnAck:
    reason: int  #: 0 accepted; 0x80 and above refused (3.2.2.2)
    session_present: bool


@dataclass(frozen=True, slots=True)
class SubAck:
    packet_id: int
    reasons: tuple[int, ...]  #: granted QoS (0-2) or a failure (0x80 and above)


@dataclass(frozen=True, slots=True)
class UnsubAck:
    packet_id: int


class Publish(NamedTuple):  # a tuple: one is made per message, at the broker's rate
    topic: str
    payload: bytes
    qos: int
    packet_id: int  #: 0 for QoS 0
    sub_ids: tuple[int, ...]  #: the subscription identifiers the broker matched
    dup: bool


@dataclass(frozen=True, slots=True)
class PingResp:
    pass


@dataclass(frozen=True, slots=True)
class Disconnect:
    reason: int


Event = ConnAck | SubAck | UnsubAck | Publish | PingResp | Disconnect


# -- encoding --------------------------------------------------------------------------


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _str(text: str) -> bytes:
    data = text.encode("utf-8")
    return struct.pack("!H", len(data)) + data


def _packet(first: int, body: bytes) -> bytes:
    return bytes([first]) + _varint(len(body)) + body


def encode_connect(
    client_id: str,
    *,
    keepalive_s: int,
    max_packet: int,
    username: str | None = None,
    password: str | None = None,
    session_expiry_s: int = 0,
) -> bytes:
    """CONNECT asking the broker for no packet over ``max_packet``. With
    ``session_expiry_s`` 0, a clean start and a session that ends with the connection;
    above, the broker's session is resumed (clean start 0, 3.1.2.4) and kept that long
    after a disconnect, its subscriptions and the QoS 1 messages that match them."""
    flags = (0x80 if username is not None else 0) | (0x40 if password is not None else 0)
    flags |= 0 if session_expiry_s else 0x02
    props = b"\x27" + struct.pack("!I", max_packet)  # Maximum Packet Size
    if session_expiry_s:
        props += b"\x11" + struct.pack("!I", min(session_expiry_s, 0xFFFFFFFF))
    props += b"\x21" + struct.pack("!H", 65535)  # Receive Maximum
    body = _str("MQTT") + bytes([5, flags]) + struct.pack("!H", keepalive_s)
    body += _varint(len(props)) + props + _str(client_id)
    if username is not None:
        body += _str(username)
    if password is not None:
        data = password.encode("utf-8")
        body += struct.pack("!H", len(data)) + data
    return _packet(0x10, body)


def encode_subscribe(packet_id: int, topic_filter: str, qos: int, sub_id: int) -> bytes:
    """SUBSCRIBE to one filter, naming it with subscription identifier ``sub_id``;
    retained messages only if the session does not hold the filter yet (retain
    handling 1, 3.8.3.1): a resumed session subscribing again (a new ingest process, a
    source moved to another peer) is not sent them a second time."""
    props = b"\x0b" + _varint(sub_id)
    body = struct.pack("!H", packet_id) + _varint(len(props)) + props
    return _packet(0x82, body + _str(topic_filter) + bytes([qos | 0x10]))


def encode_unsubscribe(packet_id: int, topic_filter: str) -> bytes:
    return _packet(0xA2, struct.pack("!H", packet_id) + b"\x00" + _str(topic_filter))


def encode_pubacks(packet_ids: list[int]) -> bytes:
    """One PUBACK (success, no properties: 3.4.2.1) per id, as one buffer."""
    return b"".join(b"\x40\x02" + struct.pack("!H", pid) for pid in packet_ids)


def encode_disconnect() -> bytes:
    return b"\xe0\x00"


# -- decoding --------------------------------------------------------------------------

#: property identifier -> how its value is encoded (2.2.2.2)
_BYTE, _TWO, _FOUR, _VARINT, _UTF8, _BINARY, _PAIR = range(7)
_PROPERTY_KIND = {
    **dict.fromkeys((0x01, 0x17, 0x19, 0x24, 0x25, 0x28, 0x29, 0x2A), _BYTE),
    **dict.fromkeys((0x13, 0x21, 0x22, 0x23), _TWO),
    **dict.fromkeys((0x02, 0x11, 0x18, 0x27), _FOUR),
    0x0B: _VARINT,
    **dict.fromkeys((0x03, 0x08, 0x12, 0x15, 0x1A, 0x1C, 0x1F), _UTF8),
    **dict.fromkeys((0x09, 0x16), _BINARY),
    0x26: _PAIR,
}
_SUBSCRIPTION_ID = 0x0B
_U16 = struct.Struct("!H").unpack_from


def _bad(what: str) -> MqttProtocolError:
    return MqttProtocolError(f"malformed MQTT packet from the broker: {what}")


def _read_varint(data: bytes | bytearray, i: int, end: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if i >= end or shift > 21:
            msg = "a variable byte integer runs past its packet"
            raise _bad(msg)
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, i


def _properties(body: bytes, i: int) -> tuple[tuple[int, ...], int]:
    """Skip a property list at ``i``; its subscription identifiers, and where it ends."""
    length, i = _read_varint(body, i, len(body))
    end = i + length
    if end > len(body):
        msg = "properties run past their packet"
        raise _bad(msg)
    ids: list[int] = []
    while i < end:
        prop = body[i]
        i += 1
        kind = _PROPERTY_KIND.get(prop)
        if kind is None:
            msg = f"unknown property 0x{prop:02x}"
            raise _bad(msg)
        if kind == _VARINT:
            value, i = _read_varint(body, i, end)
            if prop == _SUBSCRIPTION_ID:
                ids.append(value)
        elif kind in (_BYTE, _TWO, _FOUR):
            i += (1, 2, 4)[kind]
        else:
            for _ in range(2 if kind == _PAIR else 1):
                if i + 2 > end:
                    msg = "a property runs past its packet"
                    raise _bad(msg)
                i += 2 + struct.unpack_from("!H", body, i)[0]
    if i != end:
        msg = "a property runs past its packet"
        raise _bad(msg)
    return tuple(ids), end


class PacketReader:
    """Bytes from a broker in, events out; ``max_packet`` bounds what it buffers."""

    def __init__(self, *, max_packet: int) -> None:
        self.max_packet = max_packet
        self._buf = bytearray()

    def receive_data(self, data: bytes) -> list[Event]:
        """Take ``data``; every event its complete packets make, in order."""
        buf = bytes(self._buf) + data if self._buf else data
        events: list[Event] = []
        i, n = 0, len(buf)
        while n - i >= 2:
            first = buf[i]
            if buf[i + 1] < 0x80:  # the common case: a packet under 128 bytes
                length, start = buf[i + 1], i + 2
            else:
                try:
                    length, start = _read_varint(buf, i + 1, min(n, i + 5))
                except MqttProtocolError:
                    if n - i >= 5:
                        raise
                    break  # the length is not all here yet
                if length > self.max_packet:
                    msg = f"a packet of {length} bytes; the limit is {self.max_packet}"
                    raise _bad(msg)
            end = start + length
            if end > n:
                break
            if first & 0xF0 == 0x30:
                events.append(_publish(first, buf, start, end))
            else:
                events.append(self._event(first, buf[start:end]))
            i = end
        self._buf = bytearray(buf[i:])
        return events

    def _event(self, first: int, body: bytes) -> Event:
        kind = first >> 4
        try:
            if kind == 2:  # CONNACK
                if len(body) < 2:
                    msg = "a short CONNACK"
                    raise _bad(msg)
                return ConnAck(reason=body[1], session_present=bool(body[0] & 1))
            if kind == 9:  # SUBACK
                pid = struct.unpack_from("!H", body)[0]
                _, i = _properties(body, 2)
                return SubAck(pid, tuple(body[i:]))
            if kind == 11:  # UNSUBACK
                return UnsubAck(struct.unpack_from("!H", body)[0])
            if kind == 13:
                return PingResp()
            if kind == 14:  # DISCONNECT: no reason means 0 (3.14.2.1)
                return Disconnect(body[0] if body else 0)
        except struct.error:
            msg = f"a short packet of type {kind}"
            raise _bad(msg) from None
        msg = f"a subscriber does not expect packet type {kind}"
        raise _bad(msg)


def _publish(first: int, buf: bytes, i: int, end: int) -> Publish:
    """The PUBLISH in ``buf[i:end]`` (3.3)."""
    qos = (first >> 1) & 3
    if qos > 1:
        msg = f"a QoS {qos} PUBLISH (subscriptions ask for at most 1)"
        raise _bad(msg)
    if end - i < 3:
        msg = "a short PUBLISH"
        raise _bad(msg)
    t = i + 2 + _U16(buf, i)[0]
    try:
        topic = buf[i + 2 : t].decode("utf-8")
    except UnicodeDecodeError:
        msg = "a topic that is not UTF-8"
        raise _bad(msg) from None
    pid = 0
    if qos:
        if t + 2 > end:
            msg = "a short PUBLISH"
            raise _bad(msg)
        pid = _U16(buf, t)[0]
        t += 2
    if t >= end:
        msg = "a PUBLISH without its properties"
        raise _bad(msg)
    plen = buf[t]
    if plen == 0:
        ids: tuple[int, ...] = ()
        t += 1
    elif plen == 2 and t + 3 <= end and buf[t + 1] == _SUBSCRIPTION_ID and buf[t + 2] < 0x80:
        ids = (buf[t + 2],)  # one small subscription identifier: what we ask for
        t += 3
    else:
        ids, t = _properties(buf[:end], t)
    if t > end:
        msg = "properties run past their packet"
        raise _bad(msg)
    return Publish(topic, buf[t:end], qos, pid, ids, bool(first & 0x08))
