"""A real Mosquitto broker on loopback, and a plain paho subscriber to check what
arrives (fixtures in ``tests/mqtt/conftest.py``).

The broker listens on a free loopback port with a generated config (anonymous, no
persistence unless asked, every connect and subscribe logged to a file the tests
read). ``scripts/setup.sh`` installs Mosquitto: a machine without it fails the MQTT
tests loudly instead of skipping them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import pytest
from paho.mqtt.properties import Properties

__all__ = ["ID", "Broker", "Consumer", "Subscriber", "mosquitto_binary"]

#: the MQTT 5 user property carrying an exactly-once mqtt sink's message ids
ID = "agiledart-id"


def mosquitto_binary() -> str:
    found = shutil.which("mosquitto") or next(
        (p for p in ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto") if os.access(p, os.X_OK)),
        None,
    )
    if found is None:
        pytest.fail(
            "the MQTT tests need the Mosquitto broker, which is not installed: run "
            "`make setup` (scripts/setup.sh installs it) or `sudo apt-get install mosquitto`",
            pytrace=False,
        )
    return found


@dataclass
class Broker:
    """One mosquitto process on 127.0.0.1:``port``; stop and start it at will."""

    workdir: Path
    port: int
    persistence: bool = False
    proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / "mosquitto.log"

    def _config(self) -> Path:
        lines = [
            f"listener {self.port} 127.0.0.1",
            "allow_anonymous true",
            f"persistence {'true' if self.persistence else 'false'}",
            "set_tcp_nodelay true",
            f"log_dest file {self.log_path}",
            *(f"log_type {t}" for t in ("error", "warning", "notice", "information")),
            "log_type subscribe",
            "log_type unsubscribe",
            "connection_messages true",
            "log_timestamp false",
        ]
        if self.persistence:  # sessions and queued messages survive a restart
            lines += [f"persistence_location {self.workdir}/", "max_queued_messages 0"]
        if os.geteuid() == 0:  # else it drops to user mosquitto, who cannot write here
            lines.append("user root")
        path = self.workdir / "mosquitto.conf"
        path.write_text("\n".join(lines) + "\n")
        return path

    def start(self) -> None:
        assert self.proc is None, "already running"
        config = self._config()
        out = open(self.workdir / "mosquitto.out", "ab")  # noqa: SIM115 - the process owns it
        self.proc = subprocess.Popen(
            [mosquitto_binary(), "-c", str(config)], stdout=out, stderr=subprocess.STDOUT
        )
        out.close()
        deadline = time.monotonic() + 20
        while True:  # a bound only so a broken setup cannot hang the test
            if self.proc.poll() is not None:
                text = (self.workdir / "mosquitto.out").read_text(errors="replace")
                self.proc = None
                raise AssertionError(f"mosquitto exited at start:\n{text}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise AssertionError("mosquitto does not listen") from None
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()  # SIGTERM: a persistent broker saves its sessions
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def log(self) -> list[str]:
        if not self.log_path.exists():
            return []
        return self.log_path.read_text(errors="replace").splitlines()

    def connects(self) -> list[str]:
        """Client ids that connected, in order (one per connection)."""
        return [line.split(" as ")[1].split(" ")[0] for line in self.log() if " as " in line]

    def subscribes(self, topic_filter: str) -> int:
        """SUBSCRIBE requests for ``topic_filter`` (log lines ``<client> <qos> <filter>``)."""
        return self._count(r"(\S+) [012] (.+)", topic_filter)

    def unsubscribes(self, topic_filter: str) -> int:
        """UNSUBSCRIBE requests for ``topic_filter`` (log lines ``<client> <filter>``)."""
        return self._count(r"(\S+) (.+)", topic_filter)

    def _count(self, pattern: str, topic_filter: str) -> int:
        clients = set(self.connects())
        return sum(
            1
            for line in self.log()
            if (m := re.fullmatch(pattern, line)) and m[1] in clients and m[2] == topic_filter
        )


@dataclass
class Subscriber:
    """A paho client on its own thread, independent of the code under test.

    ``persistent``: a fixed client id and a kept session (QoS 1), so a broker with
    persistence queues what arrives for it while it is away.
    """

    broker: Broker
    topic_filter: str
    persistent: bool = False
    messages: list[tuple[str, bytes]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _subscribed: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.client = paho.Client(
            paho.CallbackAPIVersion.VERSION2,
            client_id=f"test-subscriber-{self.broker.port}" if self.persistent else "",
            clean_session=not self.persistent,
            protocol=paho.MQTTv311,
        )
        self.client.reconnect_delay_set(min_delay=1, max_delay=1)
        self.client.on_connect = self._on_connect
        self.client.on_subscribe = self._on_subscribe
        self.client.on_message = self._on_message

    def _on_connect(self, client: paho.Client, *_: Any) -> None:
        client.subscribe(self.topic_filter, qos=1)

    def _on_subscribe(self, *_: Any) -> None:
        self._subscribed.set()

    def _on_message(self, client: paho.Client, userdata: Any, msg: paho.MQTTMessage) -> None:
        with self._lock:
            self.messages.append((msg.topic, bytes(msg.payload)))

    def __enter__(self) -> Subscriber:
        self.client.connect("127.0.0.1", self.broker.port, keepalive=10)
        self.client.loop_start()
        assert self._subscribed.wait(20), "the test subscriber got no SUBACK"
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.disconnect()
        self.client.loop_stop()

    def received(self) -> list[tuple[str, bytes]]:
        with self._lock:
            return list(self.messages)

    def records(self) -> list[dict[str, Any]]:
        return [json.loads(p) for _, p in self.received()]


class Consumer:
    """A paho MQTT 5 client on its own thread, with a session the broker keeps (it
    queues what comes while the consumer is away): every message with its user
    properties."""

    def __init__(self, broker: Broker, topic_filter: str) -> None:
        self.topic_filter = topic_filter
        self.messages: list[tuple[str, bytes, dict[str, str]]] = []
        self._lock = threading.Lock()
        self._subscribed = threading.Event()
        self.client = paho.Client(
            paho.CallbackAPIVersion.VERSION2,
            client_id=f"epoch-consumer-{broker.port}",
            protocol=paho.MQTTv5,
        )
        self.client.reconnect_delay_set(min_delay=1, max_delay=1)
        self.client.on_connect = self._on_connect
        self.client.on_subscribe = lambda *_: self._subscribed.set()
        self.client.on_message = self._on_message
        self.port = broker.port

    def _on_connect(self, client: paho.Client, *_: Any) -> None:
        client.subscribe(self.topic_filter, qos=1)

    def _on_message(self, client: paho.Client, userdata: Any, msg: paho.MQTTMessage) -> None:
        props: Properties | None = getattr(msg, "properties", None)
        user = dict(getattr(props, "UserProperty", []) or [])
        with self._lock:
            self.messages.append((msg.topic, bytes(msg.payload), user))

    def __enter__(self) -> Consumer:
        props = Properties(paho.PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        props.SessionExpiryInterval = 3600
        self.client.connect(
            "127.0.0.1", self.port, keepalive=10, clean_start=False, properties=props
        )
        self.client.loop_start()
        assert self._subscribed.wait(20), "the consumer got no SUBACK"
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.disconnect()
        self.client.loop_stop()

    def deduplicated(self) -> tuple[list[dict[str, Any]], int]:
        """The records of the messages whose id is new, in arrival order, and how many
        repeats were dropped; every message must carry its id, in both places."""
        with self._lock:
            messages = list(self.messages)
        seen: set[str] = set()
        kept, repeats = [], 0
        for topic, payload, props in messages:
            record = json.loads(payload)
            assert ID in props, f"a message on {topic} without its {ID!r}"
            assert record.pop("agiledart_id") == props[ID]
            assert topic == f"out/{record['key']}"
            if props[ID] in seen:
                repeats += 1
                continue
            seen.add(props[ID])
            kept.append(record)
        return kept, repeats
