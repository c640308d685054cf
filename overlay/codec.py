"""msgpack with hard limits, and the shape of our UDP RPC messages.

A request is ``[0, msg_id, name, args]`` and a response ``[1, msg_id, result]``, with
``msg_id`` 8 random bytes. Anything else, or anything msgpack cannot read within the
limits, is a :class:`MalformedError`; no other exception escapes a decoder.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

from .errors import MalformedError, OversizeError

REQUEST = 0
RESPONSE = 1
MSG_ID_BYTES = 8

__all__ = ["Request", "Response", "decode_rpc", "encode_request", "encode_response", "unpack"]


def unpack(data: bytes, *, max_len: int) -> Any:
    """Decode one msgpack value from ``data``, refusing anything above ``max_len``.

    Every length msgpack may announce is bounded by the size of ``data`` itself (each
    element takes at least a byte), so a few bytes announcing a billion-element array
    are refused before anything is allocated for them."""
    size = len(data)
    if size > max_len:
        msg = f"message of {size} bytes exceeds the {max_len}-byte limit"
        raise OversizeError(msg)
    try:
        return msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=True,
            max_str_len=size,
            max_bin_len=size,
            max_array_len=size,
            max_map_len=size // 2,
            max_ext_len=0,
        )
    except Exception as exc:  # msgpack raises a zoo of types on garbage
        msg = f"undecodable message: {type(exc).__name__}"
        raise MalformedError(msg) from None


def pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


@dataclass(frozen=True, slots=True)
class Request:
    msg_id: bytes
    name: str
    args: list[Any]


@dataclass(frozen=True, slots=True)
class Response:
    msg_id: bytes
    result: Any


def encode_request(msg_id: bytes, name: str, args: list[Any] | tuple[Any, ...]) -> bytes:
    return pack([REQUEST, msg_id, name, list(args)])


def encode_response(msg_id: bytes, result: Any) -> bytes:
    return pack([RESPONSE, msg_id, result])


def decode_rpc(payload: bytes, *, max_len: int) -> Request | Response:
    value = unpack(payload, max_len=max_len)
    if not isinstance(value, list) or not value:
        msg = "an RPC message is a non-empty array"
        raise MalformedError(msg)
    kind = value[0]
    if len(value) >= 2 and not (isinstance(value[1], bytes) and len(value[1]) == MSG_ID_BYTES):
        msg = "bad RPC message id"
        raise MalformedError(msg)
    if kind == REQUEST and len(value) == 4:
        _, msg_id, name, args = value
        if isinstance(name, str) and isinstance(args, list):
            return Request(msg_id, name, args)
    elif kind == RESPONSE and len(value) == 3:
        return Response(value[1], value[2])
    msg = "an RPC message is [0, id, name, args] or [1, id, result]"
    raise MalformedError(msg)
