"""Fixtures of the MQTT tests: real Mosquitto brokers and plain paho subscribers
(see :mod:`support.mqtt`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.mqtt import Broker, Subscriber, mosquitto_binary
from support.processes import free_port


@pytest.fixture
def mosquitto(tmp_path: Path) -> Iterator[Callable[..., Broker]]:
    """Make (and start) brokers; every one is stopped at the end."""
    mosquitto_binary()  # fails the test, saying how to install it, when it is missing
    made: list[Broker] = []

    def make(*, persistence: bool = False, start: bool = True) -> Broker:
        workdir = tmp_path / f"broker{len(made)}"
        workdir.mkdir()
        broker = Broker(workdir, free_port(), persistence=persistence)
        made.append(broker)
        if start:
            broker.start()
        return broker

    yield make
    for broker in made:
        broker.stop()


@pytest.fixture
def broker(mosquitto: Callable[..., Broker]) -> Broker:
    return mosquitto()


@pytest.fixture
def subscribe() -> Iterator[Callable[..., Subscriber]]:
    made: list[Subscriber] = []

    def make(broker: Broker, topic_filter: str, *, persistent: bool = False) -> Subscriber:
        sub = Subscriber(broker, topic_filter, persistent=persistent).__enter__()
        made.append(sub)
        return sub

    yield make
    for sub in made:
        sub.__exit__(None, None, None)
