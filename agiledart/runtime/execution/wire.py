"""Frames between a peer and its worker processes: 4-byte big-endian length, pickle.

Both ends are our own code on one machine (a socketpair made by the peer), so pickle is
the codec: it is the fastest way to move lists of records and operator snapshots
between Python processes. The size limit guards against a torn stream, not an
adversary; frames from other peers never reach this module.
"""

from __future__ import annotations

import asyncio
import pickle
import socket
import struct
from typing import Any

from agiledart.app.errors import ExecutionError

__all__ = ["MAX_FRAME", "WorkerGone", "pack", "read_frame", "recv_frame", "send_frame"]

MAX_FRAME = 512 * 1024 * 1024
_HEADER = struct.Struct(">I")


class WorkerGone(ExecutionError, EOFError):
    """The other end closed the stream (the process exited or was killed)."""


def pack(msg: Any) -> bytes:
    body = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(body)) + body


async def read_frame(reader: asyncio.StreamReader) -> Any:
    """The next message, on the asyncio side (the peer)."""
    try:
        (size,) = _HEADER.unpack(await reader.readexactly(_HEADER.size))
        if size > MAX_FRAME:
            msg = f"worker frame of {size} bytes exceeds {MAX_FRAME}"
            raise WorkerGone(msg)
        return pickle.loads(await reader.readexactly(size))
    except asyncio.IncompleteReadError as exc:
        msg = "worker process closed its stream"
        raise WorkerGone(msg) from exc


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            msg = "peer closed the worker stream"
            raise WorkerGone(msg)
        got += k
    return bytes(buf)


def recv_frame(sock: socket.socket) -> Any:
    """The next message, on the blocking side (a worker process)."""
    (size,) = _HEADER.unpack(_recv_exactly(sock, _HEADER.size))
    if size > MAX_FRAME:
        msg = f"frame of {size} bytes exceeds {MAX_FRAME}"
        raise WorkerGone(msg)
    return pickle.loads(_recv_exactly(sock, size))


def send_frame(sock: socket.socket, msg: Any) -> None:
    sock.sendall(pack(msg))
