"""Errors keep their type across peers: the registry's round trip, and what a hostile
or broken peer can send in an error reply (always one of our errors, never a crash)."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agiledart.app.errors import MAX_PROBLEMS, ParseError, Problem, SpecError
from agiledart.errors import (
    MAX_WIRE_MESSAGE,
    AgiledartError,
    crossing_errors,
    error_from_wire,
    error_to_wire,
)
from agiledart.overlay.auth import ClusterKey
from agiledart.overlay.channel import remote_error
from agiledart.overlay.errors import ClockSkewError, MalformedError, RemoteError
from agiledart.overlay.frames import Reply
from agiledart.overlay.tcp import ConnectionInfo, FrameClient, FrameServer
from agiledart.runtime.errors import CodeError, PeerLost, UnknownApp
from agiledart.runtime.execution.host import TurnFailed

KEY = ClusterKey.generate(random.Random("errors-cross-peers-key-0123"))


def crossed(error: AgiledartError) -> AgiledartError:
    """``error`` as a peer receives it: through the wire form, with msgpack-like values."""
    name, message, fields = error_to_wire(error)
    back = error_from_wire(name, message, fields)
    assert back is not None
    return back


def test_every_registered_class_round_trips_as_itself() -> None:
    samples: dict[type[AgiledartError], AgiledartError] = {
        SpecError: SpecError([Problem("operators[1].fn", "no such function")], name="app"),
        ParseError: ParseError(7, "not a number"),
        PeerLost: PeerLost("p3", "connection reset"),
        CodeError: CodeError("code ab... is missing", code_id="ab" * 32),
        ClockSkewError: ClockSkewError("clock ahead", skew_s=12.5),
        RemoteError: RemoteError("Foo", "bar", peer="p9"),
    }
    for name, cls in crossing_errors().items():
        original = samples.get(cls)
        if original is None:
            original = cls.from_wire_state(
                f"a {name}", {f: _value(t) for f, t in cls.wire_fields.items()}
            )
        back = crossed(original)
        assert type(back) is cls, name
        assert str(back) == str(original), name
        assert cls.wire_state(back) == cls.wire_state(original), name


def _value(kind: type) -> Any:
    return {str: "x", int: 1, float: 1.5, bool: True}[kind]


def test_a_spec_error_keeps_every_problem_with_its_path() -> None:
    original = SpecError(
        [Problem("operators[0].params.size_ms", "must be positive"), Problem("", "no sink")],
        name="wc",
    )
    back = crossed(original)
    assert isinstance(back, SpecError)
    assert back.problems == original.problems
    assert back.paths == ("operators[0].params.size_ms", "")
    assert back.name == "wc"


def test_an_unregistered_class_crosses_as_its_nearest_registered_ancestor() -> None:
    name, message, _ = error_to_wire(TurnFailed("the operator raised"))
    assert name == "ExecutionError"
    assert message == "the operator raised"


def test_a_name_not_known_here_is_a_remote_error_that_keeps_the_name() -> None:
    error = remote_error(Reply(1, False, None, "SomethingNew", "it broke", None), "p2")
    assert isinstance(error, RemoteError)
    assert (error.error_type, error.remote_message, error.remote_peer) == (
        "SomethingNew",
        "it broke",
        "p2",
    )


def test_a_remote_error_names_the_peer_that_raised_it() -> None:
    error = remote_error(Reply(1, False, None, "UnknownApp", "no app a1", None), "p2")
    assert isinstance(error, UnknownApp)
    assert error.remote_peer == "p2"
    assert UnknownApp("raised here").remote_peer is None


HOSTILE_FIELDS = [
    ("SpecError", {"name": "x", "problems": 5}),
    ("SpecError", {"name": "x", "problems": [["a"]]}),
    ("SpecError", {"name": "x", "problems": [[1, 2]]}),
    ("SpecError", {"name": 3, "problems": []}),
    ("SpecError", {"name": "x", "problems": [["a", "b"]] * 100_000}),
    ("PeerLost", {}),
    ("PeerLost", {"peer": b"bytes"}),
    ("ParseError", {"line": "7", "reason": "r"}),
    ("ClockSkewError", {"skew_s": float("nan")}),
    ("CodeError", [1, 2]),
    ("CodeError", {str(i): i for i in range(1000)}),
]


@pytest.mark.parametrize(("name", "fields"), HOSTILE_FIELDS)
def test_fields_that_do_not_fit_their_class_are_a_malformed_reply(name: str, fields: Any) -> None:
    error = remote_error(Reply(1, False, None, name, "m", fields), "evil")
    assert isinstance(error, MalformedError)
    assert error.remote_peer == "evil"


def test_an_oversized_message_is_a_malformed_reply_and_an_oversized_name_is_cut() -> None:
    huge = "x" * (MAX_WIRE_MESSAGE + 1)
    assert isinstance(
        remote_error(Reply(1, False, None, "UnknownApp", huge, None), "e"), MalformedError
    )
    unknown = remote_error(Reply(1, False, None, "N" * 100_000, huge, None), "e")
    assert isinstance(unknown, RemoteError)
    assert len(unknown.error_type) <= 64
    assert len(unknown.remote_message) <= 1000


msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=20)
    | st.binary(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=60)
@given(
    name=st.sampled_from(sorted(crossing_errors())) | st.text(max_size=70),
    message=st.text(max_size=50),
    fields=msgpack_values,
)
def test_any_error_reply_becomes_one_of_our_errors(name: str, message: str, fields: Any) -> None:
    error = remote_error(Reply(1, False, None, name, message, fields), "fuzz")
    assert isinstance(error, AgiledartError)
    assert error.remote_peer == "fuzz"


@contextlib.asynccontextmanager
async def serving(server: FrameServer) -> AsyncIterator[tuple[str, int]]:
    async with asyncio.TaskGroup() as group, server:
        yield await server.start(group)


class _Lie(AgiledartError):
    """What the hostile peer raises; it answers for it with a SpecError full of garbage."""


def _lying_to_wire(error: AgiledartError) -> tuple[str, str, dict[str, Any]]:
    if isinstance(error, _Lie):
        return "SpecError", "m", {"name": "x", "problems": [{"not": "a pair"}] * 50}
    return error_to_wire(error)


async def test_a_hostile_error_reply_fails_that_request_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("agiledart.overlay.channel.error_to_wire", _lying_to_wire)

    async def lies(request: dict[str, Any], conn: ConnectionInfo) -> Any:
        raise _Lie

    async def refuses(request: dict[str, Any], conn: ConnectionInfo) -> Any:
        raise SpecError([Problem("operators[0].fn", "no such function")], name="a")

    server = FrameServer(key=KEY, name="mallory")
    server.route("lies", lies)
    server.route("refuses", refuses)
    async with (
        serving(server) as (host, port),
        await FrameClient.connect(host, port, key=KEY, name="alice") as client,
    ):
        with pytest.raises(MalformedError, match="does not fit"):
            await client.request("lies", timeout=5)
        with pytest.raises(SpecError) as refused:
            await client.request("refuses", timeout=5)
        assert refused.value.problems == (Problem("operators[0].fn", "no such function"),)
        assert refused.value.remote_peer == "mallory"
        assert not client.closed


class _Novel(AgiledartError):
    """An error a newer peer might raise: under no registered class."""


async def test_an_error_the_caller_does_not_know_arrives_as_remote_error_with_its_name() -> None:
    async def novel(request: dict[str, Any], conn: ConnectionInfo) -> Any:
        raise _Novel("something new went wrong")

    async def missing(request: dict[str, Any], conn: ConnectionInfo) -> Any:
        raise UnknownApp("no app called a-1")

    server = FrameServer(key=KEY, name="newer")
    server.route("novel", novel)
    server.route("missing", missing)
    async with (
        serving(server) as (host, port),
        await FrameClient.connect(host, port, key=KEY, name="older") as client,
    ):
        with pytest.raises(RemoteError) as unknown:
            await client.request("novel", timeout=5)
        assert (unknown.value.error_type, unknown.value.remote_message) == (
            "_Novel",
            "something new went wrong",
        )
        assert unknown.value.remote_peer == "newer"
        with pytest.raises(UnknownApp, match="no app called a-1") as missing_app:
            await client.request("missing", timeout=5)
        assert missing_app.value.remote_peer == "newer"


def test_an_error_that_cannot_fill_its_fields_crosses_as_its_parent() -> None:
    lost = PeerLost("p1", "reset")
    lost.peer = 7  # type: ignore[assignment]  # a bug at the raising side
    assert error_to_wire(lost) == ("ExecutionError", "lost peer p1: reset", {})
    many = SpecError([Problem(f"f{i}", "bad") for i in range(MAX_PROBLEMS + 1)])
    assert error_to_wire(many)[0] == "AppError"
