"""The subscriber's MQTT 5 packets without I/O, and the source log's writer and reader:
bytes split anywhere parse the same, any garbage is events or our protocol error, and
what a log commits reads back in order across segments, bounded and counted."""

from __future__ import annotations

import contextlib
import itertools
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agiledart.runtime.errors import BrokerError
from agiledart.runtime.mqtt.log import LogReader, LogWriter
from agiledart.runtime.mqtt.wire import (
    ConnAck,
    MqttProtocolError,
    PacketReader,
    Publish,
    SubAck,
    encode_connect,
    encode_pubacks,
    encode_subscribe,
)


def publish(topic: str, payload: bytes, *, pid: int = 0, sub_ids: tuple[int, ...] = ()) -> bytes:
    """A PUBLISH as a broker sends it (QoS 1 when ``pid``)."""
    t = topic.encode()
    props = b"".join(b"\x0b" + bytes([i]) for i in sub_ids) + b"\x26\x00\x01a\x00\x01b"
    body = struct.pack("!H", len(t)) + t + (struct.pack("!H", pid) if pid else b"")
    body += bytes([len(props)]) + props + payload
    length = len(body)
    varint = bytearray()
    while True:
        byte, length = length & 0x7F, length >> 7
        varint.append(byte | (0x80 if length else 0))
        if not length:
            break
    return bytes([0x32 if pid else 0x30]) + bytes(varint) + body


STREAM = (
    b"\x20\x03\x00\x00\x00"  # CONNACK, accepted, no properties
    + b"\x90\x04\x00\x07\x00\x01"  # SUBACK of packet 7: QoS 1 granted
    + publish("a/b", b'{"v": 1}', pid=5, sub_ids=(3,))
    + publish("a/c", b"x" * 300)  # a two-byte remaining length
    + b"\xd0\x00"  # PINGRESP
)


@given(st.lists(st.integers(0, len(STREAM)), max_size=6))
def test_bytes_split_anywhere_parse_the_same(cuts: list[int]) -> None:
    reader = PacketReader(max_packet=1 << 16)
    events = []
    bounds = [0, *sorted(cuts), len(STREAM)]
    for a, b in itertools.pairwise(bounds):
        events += reader.receive_data(STREAM[a:b])
    assert events[0] == ConnAck(reason=0, session_present=False)
    assert events[1] == SubAck(7, (1,))
    assert events[2] == Publish("a/b", b'{"v": 1}', 1, 5, (3,), False)
    assert events[3] == Publish("a/c", b"x" * 300, 0, 0, (), False)
    assert len(events) == 5


@settings(max_examples=300)
@given(st.binary(max_size=200))
def test_any_garbage_is_events_or_our_protocol_error(data: bytes) -> None:
    reader = PacketReader(max_packet=1 << 16)
    with contextlib.suppress(MqttProtocolError):
        reader.receive_data(data)
    assert issubclass(MqttProtocolError, BrokerError)


def test_a_packet_over_the_limit_is_refused_before_it_is_buffered() -> None:
    reader = PacketReader(max_packet=100)
    with pytest.raises(MqttProtocolError, match="limit is 100"):
        reader.receive_data(b"\x30\xc8\x01")  # 200 bytes announced


def test_what_a_subscriber_sends() -> None:
    connect = encode_connect("c", keepalive_s=30, max_packet=1 << 20, username="u", password="p")
    assert connect[0] == 0x10
    assert b"\x21\xff\xff" in connect  # Receive Maximum: no cap of 20 from the broker
    assert encode_subscribe(9, "a/#", 1, 4) == b"\x82\x0b\x00\x09\x02\x0b\x04\x00\x03a/#\x11"
    assert encode_pubacks([1, 258]) == b"\x40\x02\x00\x01\x40\x02\x01\x02"


def test_the_log_reads_back_what_was_committed_across_segments(tmp_path: Path) -> None:
    writer = LogWriter(tmp_path, max_bytes=1 << 20, segment_bytes=100)
    reader = LogReader(tmp_path)
    sent = [(f"t/{i}", bytes([i]) * i) for i in range(40)]
    got: list[tuple[str, bytes]] = []
    for i in range(0, 40, 7):
        for topic, payload in sent[i : i + 7]:
            assert writer.append(topic, payload)
        if i == 0:
            assert reader.read(100) == []  # nothing is readable before its commit
        reader.committed = writer.commit() + reader.committed
        got += reader.read(5)
        reader.release()
        writer.reader_at(reader.position)
    got += reader.read(100)
    assert got == sent
    assert len(list(tmp_path.glob("*.log"))) > 1  # it rolled segments
    reader.release()
    assert len(list(tmp_path.glob("*.log"))) == 1  # and removed those read past
    reader.close()
    assert not tmp_path.exists()


def test_a_full_log_sheds_and_counts(tmp_path: Path) -> None:
    writer = LogWriter(tmp_path, max_bytes=1 << 20, limit=3)
    reader = LogReader(tmp_path)
    accepted = [writer.append("t", b"%d" % i) for i in range(5)]
    assert accepted == [True, True, True, False, False]
    reader.committed = writer.commit()
    assert (writer.shed, writer.committed) == (2, 3)
    assert reader.skip(2) == 2  # a source shedding its oldest
    assert reader.read(10) == [("t", b"2")]
    writer.reader_at(reader.position)
    assert writer.append("t", b"5")  # room again once read
    small = LogWriter(tmp_path / "small", max_bytes=20)
    assert small.append("t", b"x")
    assert not small.append("t", b"y" * 20)  # over max_bytes
    assert small.shed == 1


def test_connect_resumes_a_session_only_when_it_is_kept(tmp_path: Path) -> None:
    clean = encode_connect("c", keepalive_s=30, max_packet=1 << 20)
    kept = encode_connect("c", keepalive_s=30, max_packet=1 << 20, session_expiry_s=3600)
    flags = 9  # fixed header (2 bytes), protocol name (6), level (1)
    assert clean[flags] & 0x02  # clean start
    assert not kept[flags] & 0x02  # resume the broker's session
    assert b"\x11" + struct.pack("!I", 3600) in kept  # Session Expiry Interval
    assert b"\x11\x00\x00" not in clean


def test_a_reopened_log_goes_on_after_its_last_whole_frame(tmp_path: Path) -> None:
    writer = LogWriter(tmp_path, max_bytes=1 << 20, segment_bytes=60)
    for i in range(10):
        assert writer.append("t", b"%d" % i)
        writer.commit()
    writer.close()
    last = max(tmp_path.glob("*.log"), key=lambda p: int(p.stem))
    with last.open("ab") as f:  # a commit torn by the process dying
        f.write(struct.pack("!IH", 50, 1) + b"t" + b"x" * 7)
    again = LogWriter(tmp_path, max_bytes=1 << 20, segment_bytes=60)
    assert again.committed == 10
    for i in range(10, 13):
        assert again.append("t", b"%d" % i)
    again.commit()
    reader = LogReader(tmp_path, start=4)  # a checkpoint's position
    reader.committed = again.committed
    assert reader.read(100) == [("t", b"%d" % i) for i in range(4, 13)]


def test_the_log_keeps_every_segment_from_the_position_released_on(tmp_path: Path) -> None:
    writer = LogWriter(tmp_path, max_bytes=1 << 20, segment_bytes=40)
    reader = LogReader(tmp_path)
    for i in range(30):
        writer.append("t", b"%02d" % i)
        writer.commit()  # one commit each: they roll segments of 40 bytes
    reader.committed = writer.committed
    assert len(reader.read(100)) == 30  # all read: that alone removes nothing
    reader.release(12)  # an epoch committed at position 12
    writer.reader_at(reader.position, reader.released)
    assert 0 < reader.released <= 12
    assert min(int(p.stem) for p in tmp_path.glob("*.log")) == reader.released
    replay = LogReader(tmp_path, start=12)
    replay.committed = writer.committed
    assert replay.read(100) == [("t", b"%02d" % i) for i in range(12, 30)]
    assert writer.disk_bytes == sum(p.stat().st_size for p in tmp_path.glob("*.log"))
