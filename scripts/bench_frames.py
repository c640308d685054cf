"""Throughput of authenticated frames over loopback, one direction, two processes.

A server process receives; this process sends N one-way frames and then waits for
the receiver's acknowledgement that all have arrived (a request for frames, eight bytes
for raw). Measured: small frames (100-byte payload) per second and MB/s of 64 KiB
frames, for ``FrameClient.send`` -> ``FrameServer.on_stream`` (HMAC-SHA256 tags,
msgpack, dispatch to an async handler) and, as the anchor, raw asyncio streams
carrying the same 4-byte-length-prefixed payloads that the receiver only counts. Both
sides also report their CPU time per frame, which stays meaningful when other work
shares the machine.

    python scripts/bench_frames.py [--json] [--quick] [--loop uvloop|asyncio]

The last line printed with ``--json`` is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import random
import struct
import sys
import time
from multiprocessing.connection import Connection
from typing import Any

from agiledart.overlay.auth import ClusterKey
from agiledart.overlay.tcp import ConnectionInfo, FrameClient, FrameServer

SMALL = 100
LARGE = 64 * 1024
KEY = ClusterKey.generate(random.Random("bench-frames-cluster-key"))


def _run(main: Any, loop: str) -> Any:
    if loop == "uvloop":
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)


# -- receiver (child process) ----------------------------------------------------------


class _Counter(asyncio.Protocol):
    """Raw receiver: an 8-byte expected total, then counts bytes and acks with one byte."""

    def __init__(self) -> None:
        self.expected = -1
        self.seen = 0
        self.head = b""

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self.expected < 0:
            self.head += data
            if len(self.head) < 8:
                return
            self.expected = struct.unpack(">Q", self.head[:8])[0]
            data = self.head[8:]
        self.seen += len(data)
        if self.seen >= self.expected:
            self.transport.write(struct.pack(">d", time.process_time()))
            self.expected, self.seen, self.head = -1, 0, b""


async def _receiver(pipe: Connection) -> None:
    count = {"frames": 0}

    async def batch(message: dict[str, Any], conn: ConnectionInfo) -> None:
        count["frames"] += 1

    async def sync(message: dict[str, Any], conn: ConnectionInfo) -> list[float]:
        n, count["frames"] = count["frames"], 0
        return [n, time.process_time()]

    loop = asyncio.get_running_loop()
    raw = await loop.create_server(_Counter, "127.0.0.1", 0)
    async with asyncio.TaskGroup() as group, FrameServer(key=KEY, name="receiver") as server:
        server.on_stream("b", batch)
        server.route("sync", sync)
        _, port = await server.start(group)
        pipe.send((port, raw.sockets[0].getsockname()[1]))
        await loop.run_in_executor(None, pipe.recv)  # until the sender is done
        raw.close()
        await server.aclose()


def _receiver_main(pipe: Connection, loop: str) -> None:
    _run(_receiver(pipe), loop)


# -- sender (this process) -------------------------------------------------------------


Timing = tuple[float, float, float]  # wall seconds, sender CPU s, receiver CPU s


async def _framed(port: int, size: int, count: int) -> Timing:
    payload = os.urandom(size)
    async with await FrameClient.connect("127.0.0.1", port, key=KEY, name="sender") as client:
        for _ in range(min(count, 2000)):  # warm-up
            await client.send("b", {"d": payload})
        _, their_cpu = await client.request("sync", timeout=60)
        start, my_cpu = time.perf_counter(), time.process_time()
        for _ in range(count):
            await client.send("b", {"d": payload})
        got, their_end = await client.request("sync", timeout=600)
        elapsed, my_end = time.perf_counter() - start, time.process_time()
    if got != count:
        msg = f"receiver counted {got} frames, sent {count}"
        raise RuntimeError(msg)
    return elapsed, my_end - my_cpu, their_end - their_cpu


async def _raw(port: int, size: int, count: int) -> Timing:
    frame = struct.pack(">I", size) + os.urandom(size)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.transport.set_write_buffer_limits(high=1024 * 1024)
    try:
        their: list[float] = []
        for n in (min(count, 2000), count):  # warm-up, then the measured run
            start, my_cpu = time.perf_counter(), time.process_time()
            writer.write(struct.pack(">Q", n * len(frame)))
            for _ in range(n):
                writer.write(frame)
                if writer.transport.get_write_buffer_size() > 1024 * 1024:
                    await writer.drain()
            their.append(struct.unpack(">d", await reader.readexactly(8))[0])
        return time.perf_counter() - start, time.process_time() - my_cpu, their[1] - their[0]
    finally:
        writer.close()


async def _sender(ports: tuple[int, int], small: int, large: int) -> dict[str, Any]:
    framed_port, raw_port = ports
    out: dict[str, Any] = {}
    for label, port, measure in (("frames", framed_port, _framed), ("raw", raw_port, _raw)):
        t_small, send_small, recv_small = await measure(port, SMALL, small)
        t_large, send_large, recv_large = await measure(port, LARGE, large)
        out[label] = {
            "small_frames_per_s": round(small / t_small),
            "small_payload_MB_per_s": round(small * SMALL / t_small / 1e6, 1),
            "small_sender_cpu_us_per_frame": round(send_small / small * 1e6, 2),
            "small_receiver_cpu_us_per_frame": round(recv_small / small * 1e6, 2),
            "large_frames_per_s": round(large / t_large),
            "large_payload_MB_per_s": round(large * LARGE / t_large / 1e6, 1),
            "large_sender_cpu_us_per_frame": round(send_large / large * 1e6, 1),
            "large_receiver_cpu_us_per_frame": round(recv_large / large * 1e6, 1),
        }
    out["frames_vs_raw"] = {
        "small": round(out["frames"]["small_frames_per_s"] / out["raw"]["small_frames_per_s"], 3),
        "large": round(
            out["frames"]["large_payload_MB_per_s"] / out["raw"]["large_payload_MB_per_s"], 3
        ),
    }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object last")
    parser.add_argument("--quick", action="store_true", help="a tenth of the frames")
    parser.add_argument("--small", type=int, default=300_000, help="100-byte frames sent")
    parser.add_argument("--large", type=int, default=6_000, help="64 KiB frames sent")
    try:
        import uvloop  # noqa: F401

        default_loop = "uvloop"
    except ImportError:
        default_loop = "asyncio"
    parser.add_argument("--loop", choices=["uvloop", "asyncio"], default=default_loop)
    args = parser.parse_args(argv)
    small, large = (args.small // 10, args.large // 10) if args.quick else (args.small, args.large)

    ctx = mp.get_context("spawn")
    mine, theirs = ctx.Pipe()
    child = ctx.Process(target=_receiver_main, args=(theirs, args.loop), daemon=True)
    child.start()
    try:
        ports = mine.recv()
        result = _run(_sender(ports, small, large), args.loop)
    finally:
        mine.send("done")
        child.join(30)
        if child.is_alive():
            child.kill()
    result = {
        "bench": "frames",
        "loop": args.loop,
        "cpus": os.cpu_count(),
        "small_payload_bytes": SMALL,
        "large_payload_bytes": LARGE,
        "small_frames": small,
        "large_frames": large,
        **result,
    }
    if args.json:
        print(json.dumps(result))
    else:
        for label in ("frames", "raw"):
            r = result[label]
            print(
                f"{label:>6}: {r['small_frames_per_s']:>9,} frames/s at {SMALL} B "
                f"(CPU us/frame: send {r['small_sender_cpu_us_per_frame']}, "
                f"receive {r['small_receiver_cpu_us_per_frame']}); "
                f"{r['large_payload_MB_per_s']:>7,.1f} MB/s at 64 KiB "
                f"(send {r['large_sender_cpu_us_per_frame']}, "
                f"receive {r['large_receiver_cpu_us_per_frame']})"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
