"""An mqtt source is exactly-once through failures: real peer processes, a real
Mosquitto, a publisher that behaves as a device does (QoS 1, waiting for each PUBACK,
connecting again after an outage).

The app counts readings per key as they come (a running ``count`` on edge-1, into a
JSONL file on gateway-1): one reading lost or repeated changes every count after it,
so the file equals the plain-Python reference over the published readings only if
each reading reached the app exactly once. Mid-run, (b) the count's peer is killed
(the source's peer lives: its log replays what came after the last checkpoint, and
logs what arrives while the app is being restored), the source's peer is restarted on
its state directory (its log and its broker session are taken up again), and (d) the
broker is restarted with persistence (what arrives while the peer reconnects waits in
its persistent session).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import pytest
from support.apps import normalise, read_jsonl
from support.mqtt import Broker
from support.processes import poll
from support.sinksite import EDGE_1, SENSOR_1, counted, five_peers, status, submit

from agiledart.app import parse_spec
from agiledart.emulation import LocalCluster
from agiledart.local.reference import canonical, reference_outputs

pytestmark = [pytest.mark.processes]

KEYS = 8


@pytest.fixture
def site(tmp_path: Path) -> Iterator[LocalCluster]:
    with five_peers(tmp_path) as cluster:
        yield cluster


def reading(i: int) -> dict[str, Any]:
    return {"key": f"k{i % KEYS}", "seq": i, "ts": 1_000_000 + 2 * i}


class Publisher:
    """A device: one paho client, QoS 1, each message sent until the broker acks it."""

    def __init__(self, broker: Broker, topic: str = "plant/{key}/count") -> None:
        self.broker = broker
        self.topic = topic
        self.client = paho.Client(paho.CallbackAPIVersion.VERSION2, protocol=paho.MQTTv311)
        self.client.max_inflight_messages_set(20)
        self.client.connect("127.0.0.1", broker.port, keepalive=10)
        self.client.loop_start()
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def send(self, first: int, end: int, rate: float | None = None) -> None:
        """Publish readings ``first`` .. ``end - 1`` (at ``rate`` per second)."""
        t0 = time.monotonic()
        window: list[paho.MQTTMessageInfo] = []
        for i in range(first, end):
            r = reading(i)
            info = self.client.publish(self.topic.format(**r), json.dumps(r), qos=1)
            window.append(info)
            if len(window) >= 20:
                for w in window:
                    w.wait_for_publish(timeout=30)
                    assert w.is_published(), "the broker did not take a reading"
                window.clear()
            if rate is not None:
                ahead = t0 + (i - first + 1) / rate - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)
        for w in window:
            w.wait_for_publish(timeout=30)
            assert w.is_published(), "the broker did not take a reading"

    def start(self, first: int, end: int, rate: float) -> None:
        def run() -> None:
            try:
                self.send(first, end, rate)
            except BaseException as exc:
                self.error = exc

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def join(self) -> None:
        if self.thread is not None:
            self.thread.join(timeout=120)
            assert not self.thread.is_alive()
        assert self.error is None, self.error

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def counting(broker: Broker, name: str, count: int) -> dict[str, Any]:
    return counted(
        name,
        "mqtt",
        {
            "broker": broker.address,
            "topic": "plant/+/count",
            "qos": 1,
            "count": count,
        },
    )


def subscribed(cluster: LocalCluster, app_id: str) -> bool:
    peer = status(cluster, app_id)["peers"].get("sensor-1", {})
    return bool(peer.get("sources", {}).get("readings", {}).get("subscribed"))


def committed(cluster: LocalCluster, app_id: str, records: int) -> None:
    def ready() -> bool:
        s = status(cluster, app_id)
        return s["checkpoint"] is not None and s["totals"]["sink_records"] > records

    poll(ready, what="a committed checkpoint", timeout=120)


def finished(cluster: LocalCluster, app_id: str, timeout: float = 120) -> dict[str, Any]:
    last: list[dict[str, Any]] = []

    def done() -> dict[str, Any] | None:
        last[:] = [status(cluster, app_id)]
        s = last[0]
        return s if s["state"] in ("finished", "failed", "stopped") else None

    try:
        return dict(poll(done, what=f"{app_id} to end", timeout=timeout))
    except AssertionError:  # say where it stands: the sources' counts, the recoveries
        s = last[0] if last else {}
        sources = {p: v.get("sources") for p, v in s.get("peers", {}).items()}
        keys = ("state", "recoveries", "totals", "error")
        where = ({k: s.get(k) for k in keys}, sources)
        raise AssertionError(f"{app_id} did not end: {where}") from None


def check_exact(spec_raw: dict[str, Any], s: dict[str, Any], count: int) -> None:
    assert s["state"] == "finished", s.get("error")
    inputs = {"readings": [reading(i) for i in range(count)]}
    want = normalise(reference_outputs(parse_spec(spec_raw), inputs=inputs)["out"])
    got = read_jsonl(Path(s["peers"]["gateway-1"]["sinks"]["out"]["path"]))
    assert len(got) == len(want)
    assert canonical(got) == canonical(want)


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("fault", "peer"), [("killed", EDGE_1), ("restarted", SENSOR_1), ("moved", SENSOR_1)]
)
def test_a_peer_fails_mid_run_and_every_reading_counts_once(
    site: LocalCluster, mosquitto: Any, fault: str, peer: int
) -> None:
    """(b) the count's peer dies, the source's survives; the source's own peer
    restarts on its state directory; and (a) the source's peer dies for good (``kill
    -9``, never back): the source moves to another peer, which resumes the source's
    broker session and drops the broker's redeliveries of what the checkpoint covers.
    Readings keep coming meanwhile. The broker keeps what a client that is away may miss
    (``max_queued_messages 0``: Mosquitto's default queue of 1000 would drop the rest of
    a restart's readings, and say so in its log)."""
    broker = mosquitto(persistence=True)
    count = 5000
    spec_raw = counting(broker, f"mqtt-{fault}", count)
    app_id = submit(site, spec_raw)
    poll(lambda: subscribed(site, app_id), what="the source subscribes")
    device = Publisher(broker)
    try:
        device.start(0, count, rate=500)  # 10 s: on through the failure and the restore
        committed(site, app_id, 800)
        if fault in ("killed", "moved"):  # moved: the source's own peer, for good
            site.kill(peer)
        else:
            site.restart(peer)
        device.join()
    finally:
        device.close()
    s = finished(site, app_id)
    assert [e["dead"] for e in s["recoveries"]] == [site.name(peer)]
    check_exact(spec_raw, s, count)


@pytest.mark.timeout(180)
def test_the_broker_restarts_mid_run_and_every_reading_counts_once(
    site: LocalCluster, mosquitto: Any
) -> None:
    """(d) a persistent broker restarts; the device publishes again as soon as it is
    back, while the peer is still waiting to reconnect: the peer's session keeps it."""
    broker = mosquitto(persistence=True)
    count = 3000
    spec_raw = counting(broker, "mqtt-broker", count)
    app_id = submit(site, spec_raw)
    poll(lambda: subscribed(site, app_id), what="the source subscribes")
    device = Publisher(broker)
    device.send(0, 1000)
    device.close()
    poll(lambda: status(site, app_id)["totals"]["source_records"] >= 1000, what="the first part")
    broker.stop()
    time.sleep(2.5)  # the peer's back-off grows to seconds
    broker.start()
    device = Publisher(broker)  # the device reconnects first and sends on
    device.send(1000, count)
    device.close()
    s = finished(site, app_id, timeout=60)
    assert s["recoveries"] == []
    check_exact(spec_raw, s, count)
