"""Authenticated, length-prefixed msgpack frames: the sans-IO protocol of ``PORT``/tcp.

Theory of operation
-------------------
A :class:`FrameConnection` never touches a socket (h11's design): feed it what arrived
with :meth:`~FrameConnection.receive_data`, pull events with
:meth:`~FrameConnection.next_event` until :data:`NEED_DATA`, write whatever
:meth:`~FrameConnection.data_to_send` and :meth:`~FrameConnection.send` return.

Every unit on the wire is ``u32 length (big-endian) | payload``, the length counting the
payload only. A session starts with three handshake frames (payload at most
``MAX_HANDSHAKE`` bytes), then carries data frames in both directions::

    1 client HELLO   len | msgpack ["agiledart/frames", VERSION, nonce_c (32), client_name,
                                    key_id (4)]
    2 server HELLO   len | core = msgpack [VERSION, nonce_s (32), server_name] | proof_s (32)
    3 client PROOF   len | proof_c (32)
    n data frame     len | body = msgpack {"t": type, "id": int | None, ...} | tag (16)

with ``K`` the frames sub-key (HKDF, ``keys.py``) of the cluster key whose id the client
named (the server accepts its current and, during a rotation, its previous key), and
the transcript hash
``th = SHA256(u32 len(hello_c) | hello_c | u32 len(core) | core)``::

    proof_s = HMAC-SHA256(K, "server proof\\0" | th)     client checks it: server holds K
    proof_c = HMAC-SHA256(K, "client proof\\0" | th)     server checks it: client holds K
    key_c2s = HMAC-SHA256(K, "frames c2s\\0" | th)       one key per direction
    key_s2c = HMAC-SHA256(K, "frames s2c\\0" | th)
    tag_i   = HMAC-SHA256(key_dir, u64 i | body)[:16]    i = 0, 1, 2, ... per direction

The tag is HMAC-SHA-256-128 (truncated to 128 bits, as in RFC 4868). The sequence number
``i`` is implicit, as in SSH's packet MAC (RFC 4253 §6.4): both ends count the frames of
each direction, and session keys come from a transcript hash as in TLS 1.3's key
schedule (RFC 8446 §7.1), here with MACs only. So a frame replayed,
dropped, reordered or duplicated within a connection is verified under the wrong ``i``;
a frame spliced in from another connection under the wrong key (every session key
depends on both fresh nonces); a frame reflected back to its sender under the key of the
other direction; and a recorded handshake replayed to a server fails ``proof_c``
because the server's nonce is new. Distinct labels keep a proof from serving as the
other side's proof or as a key. Tags are checked before msgpack sees a byte, so only a
holder of the cluster key can make a peer decode anything but a handshake.

A client naming a key id the server does not hold gets, instead of the server HELLO,
the refusal ``msgpack [VERSION, "key-differs"]`` and a close; both ends then raise
:class:`KeyMismatch`, whose message says to check the key. The refusal carries
nothing derived from the server's key, so it gives a keyless client nothing to test
guesses against (and keys of full strength leave nothing to guess).

Not covered: confidentiality (frames are signed, not encrypted); a peer name is what a
holder of the cluster key claims; cutting a connection between two frames looks like
a close, so request/reply and acknowledgements, not this layer, detect lost tails.

Bodies are msgpack maps: ``{"t": type, "id": None, ...}`` is one-way, ``{"t": type,
"id": n, ...}`` a request, and ``{"t": "reply", "id": n, "ok": true, "result": r}`` or
``{"t": "reply", "id": n, "ok": false, "error": {"type": str, "message": str}}`` its
answer; events :class:`OneWay`, :class:`Request` and :class:`Reply` carry them.

Limits: a length above ``MAX_HANDSHAKE`` during the handshake, or above
``max_frame + 16`` afterwards, is refused from the four header bytes alone, before any
of the payload is buffered, so an incomplete frame never costs more than its (bounded)
length. EOF in the middle of a frame is a truncated frame. Every failure raises
exactly one :class:`BadMessage` (:class:`AuthError`, :class:`OversizeError`,
:class:`MalformedError`) and breaks the connection for good: drivers close it.

Handshake states are the table ``TRANSITIONS`` (h11's ``_state.py``); using the
connection in a state that does not allow it raises :class:`FrameStateError`.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import random
import struct
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, cast

import msgpack

from .codec import pack, unpack
from .errors import (
    AuthError,
    BadMessage,
    KeyMismatch,
    MalformedError,
    OverlayError,
    OversizeError,
)
from .keys import KEY_ID_BYTES, ClusterKey

VERSION: Final = 2
MAGIC: Final = "agiledart/frames"
HEADER: Final = 4
TAG: Final = 16
PROOF: Final = 32
NONCE: Final = 32
MAX_HANDSHAKE: Final = 512
MAX_NAME: Final = 64
MAX_TYPE: Final = 64
DEFAULT_MAX_FRAME: Final = 16 * 1024 * 1024
KEY_DIFFERS: Final = "key-differs"
PURPOSE: Final = b"agiledart/frames/v2"
MAX_ID: Final = 2**63 - 1
REPLY: Final = "reply"

_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")

__all__ = [
    "DEFAULT_MAX_FRAME",
    "NEED_DATA",
    "TRANSITIONS",
    "ConnectionClosed",
    "Event",
    "FrameConnection",
    "FrameStateError",
    "HandshakeComplete",
    "Input",
    "NeedData",
    "OneWay",
    "Reply",
    "Request",
    "Role",
    "State",
    "error_reply",
    "ok_reply",
    "one_way_message",
    "request_message",
]


class FrameStateError(OverlayError):
    """A frame connection was used in a state that does not allow it (local misuse)."""


class Role(enum.Enum):
    CLIENT = "client"
    SERVER = "server"


class State(enum.Enum):
    AWAIT_HELLO = "await-hello"  #: server: waiting for the client's HELLO
    AWAIT_PROOF = "await-proof"  #: server: sent its HELLO, waiting for the client's proof
    AWAIT_SERVER_HELLO = "await-server-hello"  #: client: sent HELLO
    OPEN = "open"  #: both sides proven; data frames flow
    CLOSED = "closed"  #: the peer closed cleanly at a frame boundary
    BROKEN = "broken"  #: a BadMessage was raised; nothing more is accepted


class Input(enum.Enum):
    CLIENT_HELLO = "client-hello"
    SERVER_HELLO = "server-hello"
    CLIENT_PROOF = "client-proof"
    FRAME = "frame"
    EOF = "eof"
    ERROR = "error"


_LIVE = (State.AWAIT_HELLO, State.AWAIT_PROOF, State.AWAIT_SERVER_HELLO, State.OPEN)
TRANSITIONS: Final[Mapping[tuple[State, Input], State]] = {
    (State.AWAIT_HELLO, Input.CLIENT_HELLO): State.AWAIT_PROOF,
    (State.AWAIT_PROOF, Input.CLIENT_PROOF): State.OPEN,
    (State.AWAIT_SERVER_HELLO, Input.SERVER_HELLO): State.OPEN,
    (State.OPEN, Input.FRAME): State.OPEN,
    **{(state, Input.EOF): State.CLOSED for state in _LIVE},
    **{(state, Input.ERROR): State.BROKEN for state in _LIVE},
}
_INITIAL = {Role.CLIENT: State.AWAIT_SERVER_HELLO, Role.SERVER: State.AWAIT_HELLO}
_EXPECTS = {
    State.AWAIT_HELLO: Input.CLIENT_HELLO,
    State.AWAIT_PROOF: Input.CLIENT_PROOF,
    State.AWAIT_SERVER_HELLO: Input.SERVER_HELLO,
}


# -- events ---------------------------------------------------------------------------


class NeedData:
    """Nothing more can be parsed until more bytes (or EOF) arrive."""

    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA: Final = NeedData()


@dataclass(frozen=True, slots=True)
class HandshakeComplete:
    peer_name: str  #: the name the peer gave; it holds the cluster key


@dataclass(frozen=True, slots=True)
class Request:
    type: str
    id: int
    message: dict[str, Any]  #: the whole envelope, ``t`` and ``id`` included


@dataclass(frozen=True, slots=True)
class OneWay:
    type: str
    message: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Reply:
    id: int
    ok: bool
    result: Any  #: the result when ``ok``
    error_type: str  #: the error's wire name; "" when ``ok``
    error_message: str
    error_fields: dict[str, Any] | None = None  #: its declared fields, if it sent any


@dataclass(frozen=True, slots=True)
class ConnectionClosed:
    """The peer closed the connection between two frames."""


Event = NeedData | HandshakeComplete | Request | OneWay | Reply | ConnectionClosed


# -- envelopes ------------------------------------------------------------------------


def request_message(type: str, id: int | None, body: Mapping[str, Any] | None) -> dict[str, Any]:
    """``{"t": type, "id": id, **body}``; ``id`` None makes a one-way message."""
    message: dict[str, Any] = {"t": type, "id": id}
    if body:
        if "t" in body or "id" in body:
            msg = "a message body must not use the envelope keys 't' and 'id'"
            raise ValueError(msg)
        message.update(body)
    return message


def one_way_message(type: str, body: Mapping[str, Any] | None) -> dict[str, Any]:
    return request_message(type, None, body)


def ok_reply(id: int, result: Any) -> dict[str, Any]:
    return {"t": REPLY, "id": id, "ok": True, "result": result}


def error_reply(
    id: int, error_type: str, message: str, fields: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """An error answer: the error's wire name, its message and, when it declares any,
    its fields (:mod:`agiledart.errors` turns them back into the error)."""
    error: dict[str, Any] = {"type": error_type, "message": message}
    if fields:
        error["fields"] = dict(fields)
    return {"t": REPLY, "id": id, "ok": False, "error": error}


def _classify(message: Any) -> Request | OneWay | Reply:
    if type(message) is not dict:
        msg = "a frame body is a msgpack map"
        raise MalformedError(msg)
    kind = message.get("t")
    mid = message.get("id")
    if type(kind) is not str or not 0 < len(kind) <= MAX_TYPE:
        msg = "a frame needs a message type 't' of 1 to 64 characters"
        raise MalformedError(msg)
    if mid is not None and (type(mid) is not int or not 0 <= mid <= MAX_ID):
        msg = "a frame's 'id' is null or an integer in [0, 2**63)"
        raise MalformedError(msg)
    if kind != REPLY:
        return OneWay(kind, message) if mid is None else Request(kind, mid, message)
    ok = message.get("ok")
    if mid is None or type(ok) is not bool:
        msg = "a reply needs an integer 'id' and a boolean 'ok'"
        raise MalformedError(msg)
    if ok:
        return Reply(mid, True, message.get("result"), "", "")
    error = message.get("error")
    if not (
        type(error) is dict
        and type(error.get("type")) is str
        and type(error.get("message")) is str
        and type(error.get("fields", {})) is dict
    ):
        msg = "an error reply needs 'error': {'type': str, 'message': str, 'fields'?: map}"
        raise MalformedError(msg)
    return Reply(mid, False, None, error["type"], error["message"], error.get("fields"))


# -- crypto ---------------------------------------------------------------------------


class _FrameMac:
    """HMAC-SHA256 (RFC 2104) with the key schedule done once; two hash copies per tag."""

    __slots__ = ("_inner", "_outer")

    def __init__(self, key: bytes) -> None:
        block = key.ljust(64, b"\0")  # keys here are 32 bytes, below SHA-256's block
        self._inner = hashlib.sha256(bytes(b ^ 0x36 for b in block))
        self._outer = hashlib.sha256(bytes(b ^ 0x5C for b in block))

    def tag(self, seq: int, body: bytes | memoryview) -> bytes:
        inner = self._inner.copy()
        inner.update(_U64.pack(seq))
        inner.update(body)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.digest()[:TAG]


def _mac(key: bytes, label: bytes, th: bytes) -> bytes:
    return hmac.new(key, label + b"\0" + th, hashlib.sha256).digest()


def _transcript(hello_c: bytes, core_s: bytes) -> bytes:
    return hashlib.sha256(
        _U32.pack(len(hello_c)) + hello_c + _U32.pack(len(core_s)) + core_s
    ).digest()


def _check_name(name: object) -> str:
    if type(name) is not str or len(name) > MAX_NAME:
        msg = "a peer name is a string of at most 64 characters"
        raise MalformedError(msg)
    return name


# -- the connection -------------------------------------------------------------------


class _ReceiveBuffer:
    """Received bytes, copied as little as possible: frames inside one received chunk are
    read in place; a frame that straddles chunks is joined once, when it is complete,
    and only its own bytes are copied."""

    __slots__ = ("_more", "data", "pos", "size")

    def __init__(self) -> None:
        self.data: bytes | memoryview = b""  #: the next unconsumed bytes: data[pos:] ...
        self.pos = 0
        self._more: deque[bytes | memoryview] = deque()  #: ... then these chunks
        self.size = 0  #: bytes buffered and not yet consumed

    def append(self, data: bytes) -> None:
        if self.size:
            self._more.append(data)
        else:
            self.data, self.pos = data, 0
        self.size += len(data)

    def contiguous(self, n: int) -> tuple[bytes | memoryview, int]:
        """A buffer and an offset at which the next ``n <= size`` bytes lie in one piece."""
        data, pos = self.data, self.pos
        have = len(data) - pos
        if have >= n:
            return data, pos
        parts: list[bytes | memoryview] = [memoryview(data)[pos:]]
        more = self._more
        while have < n:
            chunk = more.popleft()
            if len(chunk) > n - have:  # keep the rest of this chunk for later, uncopied
                more.appendleft(memoryview(chunk)[n - have :])
                chunk = memoryview(chunk)[: n - have]
            parts.append(chunk)
            have += len(chunk)
        self.data, self.pos = b"".join(parts), 0
        return self.data, 0

    def consume(self, n: int) -> None:
        """Drop ``n`` bytes, at most what :meth:`contiguous` just made available."""
        self.pos += n
        self.size -= n
        if self.pos == len(self.data):
            self.data, self.pos = (self._more.popleft() if self._more else b""), 0


class FrameConnection:
    """One end of one TCP session, as a pure object: bytes in, events and bytes out."""

    def __init__(
        self,
        *,
        role: Role,
        key: ClusterKey,
        name: str,
        max_frame: int = DEFAULT_MAX_FRAME,
        rng: random.Random | None = None,
    ) -> None:
        if len(name) > MAX_NAME:
            msg = f"a peer name has at most {MAX_NAME} characters"
            raise ValueError(msg)
        if not 1 <= max_frame <= 2**32 - 1 - TAG:
            msg = "max_frame must lie in [1, 2**32 - 17]"
            raise ValueError(msg)
        self.role = role
        self.name = name
        self.max_frame = max_frame
        self.peer_name: str | None = None
        self.state = _INITIAL[role]
        self.frames_in = self.frames_out = self.bytes_in = self.bytes_out = 0
        self._cluster_key = key
        self._key = key.derive(PURPOSE)
        self._nonce = (rng or random.SystemRandom()).randbytes(NONCE)
        self._buf = _ReceiveBuffer()
        self._eof = False
        self._outbox = bytearray()
        self._hello_c = b""
        self._th = b""
        self._send_seq = self._recv_seq = 0
        self._send_mac: _FrameMac | None = None
        self._recv_mac: _FrameMac | None = None
        self._packer = msgpack.Packer(use_bin_type=True)
        if role is Role.CLIENT:
            self._hello_c = pack([MAGIC, VERSION, self._nonce, name, key.key_id])
            self._emit(self._hello_c)

    # -- the h11-style surface -------------------------------------------------------

    def receive_data(self, data: bytes) -> None:
        """Buffer bytes from the peer; ``b""`` means EOF."""
        if self.state not in _LIVE or self._eof:
            msg = f"cannot receive data in state {self.state.value} (eof={self._eof})"
            raise FrameStateError(msg)
        self.bytes_in += len(data)
        if data:
            self._buf.append(data if type(data) is bytes else bytes(data))
        else:
            self._eof = True

    def next_event(self) -> Event:
        """The next event, :data:`NEED_DATA`, or exactly one :class:`BadMessage`."""
        if self.state not in _LIVE:
            msg = f"no events in state {self.state.value}"
            raise FrameStateError(msg)
        try:
            return self._next_event()
        except BadMessage:
            self._advance(Input.ERROR)
            raise

    def data_to_send(self) -> bytes:
        """Handshake bytes the protocol produced and the driver has yet to write."""
        out = bytes(self._outbox)
        self._outbox.clear()
        return out

    def send(self, message: Mapping[str, Any]) -> bytes:
        """The wire bytes of one data frame (after any pending handshake bytes)."""
        if self.state is not State.OPEN or self._send_mac is None:
            msg = f"cannot send frames in state {self.state.value}"
            raise FrameStateError(msg)
        body = self._packer.pack(message)
        size = len(body)
        if size > self.max_frame:
            msg = f"frame of {size} bytes exceeds the {self.max_frame}-byte limit"
            raise OversizeError(msg)
        tag = self._send_mac.tag(self._send_seq, body)
        self._send_seq += 1
        self.frames_out += 1
        wire = b"".join((_U32.pack(size + TAG), body, tag))
        self.bytes_out += len(wire)
        return self.data_to_send() + wire if self._outbox else wire

    # -- parsing ---------------------------------------------------------------------

    def _advance(self, step: Input) -> None:
        new = TRANSITIONS.get((self.state, step))
        if new is None:
            msg = f"illegal transition: {step.value} in state {self.state.value}"
            raise FrameStateError(msg)
        self.state = new

    def _next_event(self) -> Event:
        buf = self._buf
        data, pos = buf.data, buf.pos
        if len(data) - pos < HEADER:  # rare: the header straddles two received chunks
            if buf.size < HEADER:
                return self._short(buf.size)
            data, pos = buf.contiguous(HEADER)
        size = _U32.unpack_from(data, pos)[0]
        opened = self.state is State.OPEN
        limit = self.max_frame + TAG if opened else MAX_HANDSHAKE
        if size > limit:
            what = "frame" if opened else "handshake message"
            msg = f"{what} of {size} bytes announced, the limit is {limit}"
            raise OversizeError(msg)
        end = HEADER + size
        if buf.size < end:
            if self._eof:
                msg = f"connection closed inside a frame ({buf.size} of {end} bytes)"
                raise MalformedError(msg)
            return NEED_DATA
        if len(data) - pos < end:  # the frame straddles received chunks: join them once
            data, pos = buf.contiguous(end)
        buf.consume(end)
        if opened:
            return self._data_frame(memoryview(data)[pos + HEADER : pos + end])
        return self._handshake(bytes(data[pos + HEADER : pos + end]))

    def _short(self, have: int) -> Event:
        if not self._eof:
            return NEED_DATA
        if have:
            msg = f"connection closed inside a frame header ({have} bytes)"
            raise MalformedError(msg)
        self._advance(Input.EOF)
        return ConnectionClosed()

    def _data_frame(self, payload: memoryview) -> Event:
        if len(payload) <= TAG:
            msg = "a data frame is shorter than its tag"
            raise MalformedError(msg)
        body = payload[:-TAG]
        assert self._recv_mac is not None
        if not hmac.compare_digest(self._recv_mac.tag(self._recv_seq, body), payload[-TAG:]):
            msg = "bad frame tag: forged, replayed, reordered or from another session"
            raise AuthError(msg)
        self._recv_seq += 1
        self.frames_in += 1
        # codec.unpack reads any buffer; its annotation says bytes
        return _classify(unpack(cast(bytes, body), max_len=self.max_frame))

    def _handshake(self, payload: bytes) -> Event:
        step = _EXPECTS[self.state]
        if step is Input.CLIENT_HELLO:
            self._on_client_hello(payload)
            self._advance(step)
            return self._next_event()  # a pipelining client may already have more
        if step is Input.SERVER_HELLO:
            self._on_server_hello(payload)
        else:
            self._on_client_proof(payload)
        self._advance(step)
        assert self.peer_name is not None
        return HandshakeComplete(self.peer_name)

    def _on_client_hello(self, payload: bytes) -> None:
        hello = unpack(payload, max_len=MAX_HANDSHAKE)
        if not (isinstance(hello, list) and 4 <= len(hello) <= 5 and hello[0] == MAGIC):
            msg = "not an agiledart frames client"
            raise AuthError(msg)
        version = hello[1]
        if version != VERSION or len(hello) != 5:
            msg = f"unsupported frames protocol version {version!r} (we speak {VERSION})"
            raise AuthError(msg)
        _, _, nonce_c, name, key_id = hello
        if type(nonce_c) is not bytes or len(nonce_c) != NONCE:
            msg = "bad client nonce"
            raise MalformedError(msg)
        if type(key_id) is not bytes or len(key_id) != KEY_ID_BYTES:
            msg = "bad key id"
            raise MalformedError(msg)
        self.peer_name = _check_name(name)
        key = self._cluster_key.derive_for(key_id, PURPOSE)
        if key is None:
            self._emit(pack([VERSION, KEY_DIFFERS]))
            msg = f"client {self.peer_name!r}: the cluster key differs from this peer's"
            raise KeyMismatch(msg + ": check --cluster-key-file / AGILEDART_CLUSTER_KEY")
        self._key = key
        core = pack([VERSION, self._nonce, self.name])
        self._th = _transcript(payload, core)
        self._emit(core + _mac(self._key, b"server proof", self._th))

    def _on_server_hello(self, payload: bytes) -> None:
        if len(payload) <= PROOF:
            if unpack(payload, max_len=MAX_HANDSHAKE) == [VERSION, KEY_DIFFERS]:
                raise KeyMismatch
            msg = "server hello too short"
            raise MalformedError(msg)
        core, proof = payload[:-PROOF], payload[-PROOF:]
        hello = unpack(core, max_len=MAX_HANDSHAKE)
        if not (isinstance(hello, list) and len(hello) == 3):
            msg = "a server hello is [version, nonce, name] | proof"
            raise MalformedError(msg)
        version, nonce_s, name = hello
        if version != VERSION:
            msg = f"unsupported frames protocol version {version!r} (we speak {VERSION})"
            raise AuthError(msg)
        if type(nonce_s) is not bytes or len(nonce_s) != NONCE:
            msg = "bad server nonce"
            raise MalformedError(msg)
        peer_name = _check_name(name)
        self._th = _transcript(self._hello_c, core)
        if not hmac.compare_digest(proof, _mac(self._key, b"server proof", self._th)):
            msg = "the server failed to prove the cluster key"
            raise AuthError(msg)
        self.peer_name = peer_name
        self._emit(_mac(self._key, b"client proof", self._th))
        self._open()

    def _on_client_proof(self, payload: bytes) -> None:
        if len(payload) != PROOF or not hmac.compare_digest(
            payload, _mac(self._key, b"client proof", self._th)
        ):
            msg = "the client failed to prove the cluster key"
            raise AuthError(msg)
        self._open()

    def _open(self) -> None:
        c2s = _FrameMac(_mac(self._key, b"frames c2s", self._th))
        s2c = _FrameMac(_mac(self._key, b"frames s2c", self._th))
        client = self.role is Role.CLIENT
        self._send_mac, self._recv_mac = (c2s, s2c) if client else (s2c, c2s)

    def _emit(self, payload: bytes) -> None:
        self._outbox += _U32.pack(len(payload))
        self._outbox += payload
        self.bytes_out += HEADER + len(payload)
