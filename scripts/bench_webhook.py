"""The webhook (``http``) source's intake: records/s answered 2xx.

One ``HttpSource`` in this process (downstream takes every batch at once); the
clients in a child process (``--clients`` aiohttp sessions POSTing requests of
``--records`` records, each with its own ``Idempotency-Key``, for ``--seconds``).
Its last line is one JSON object: ``records_per_s``, ``requests_per_s``,
``receiver_cpu_us_per_record`` (this process's CPU time per record: steadier than
the rates on a shared machine) and the settings. Run it on the code before and
after a change, on the same machine::

    .venv/bin/python scripts/bench_webhook.py --json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import socket
import time
from typing import Any

TOKEN_ENV = "AGILEDART_SECRET_BENCH_WEBHOOK"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _clients(url: str, clients: int, records: int, seconds: float) -> dict[str, float]:
    import aiohttp

    auth = {"Authorization": f"Bearer {os.environ[TOKEN_ENV]}"}
    taken = requests = 0
    stop = time.monotonic() + seconds

    async def client(c: int) -> None:
        nonlocal taken, requests
        async with aiohttp.ClientSession() as session:
            i = 0
            while time.monotonic() < stop:
                body = [{"key": f"k{j % 8}", "seq": j, "ts": j} for j in range(records)]
                headers = {**auth, "Idempotency-Key": f"c{c}-{i}"}
                async with session.post(url, json=body, headers=headers) as resp:
                    await resp.read()
                    if resp.status < 300:
                        taken += records
                        requests += 1
                i += 1

    t0 = time.monotonic()
    await asyncio.gather(*(client(c) for c in range(clients)))
    elapsed = time.monotonic() - t0
    return {"records_per_s": taken / elapsed, "requests_per_s": requests / elapsed}


def _client_process(url: str, clients: int, records: int, seconds: float, out: Any) -> None:
    out.put(asyncio.run(_clients(url, clients, records, seconds)))


async def _bench(args: argparse.Namespace) -> dict[str, Any]:
    from agiledart.app.spec import SourceSpec
    from agiledart.runtime.http import HttpSource

    port = free_port()
    spec = SourceSpec(
        id="hook",
        peer="p",
        connector="http",
        params={"port": port, "token_env": TOKEN_ENV, "buffer": 1_000_000},
    )
    source = HttpSource(spec)
    emitted = 0

    async def emit(batch: list[Any]) -> None:
        nonlocal emitted
        emitted += len(batch)

    task = asyncio.create_task(source.run(emit))
    for _ in range(1000):  # until it listens
        if source.stats.listening is not None:
            break
        await asyncio.sleep(0.01)
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(
        target=_client_process,
        args=(f"http://127.0.0.1:{port}/", args.clients, args.records, args.seconds, out),
    )
    proc.start()
    cpu0 = time.process_time()
    got: dict[str, Any] = await asyncio.to_thread(out.get, timeout=args.seconds + 60)
    cpu = time.process_time() - cpu0
    proc.join()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return {
        **got,
        # the receiver's CPU time per record taken: steadier than records/s on a busy machine
        "receiver_cpu_us_per_record": cpu / max(emitted, 1) * 1e6,
        "clients": args.clients,
        "records_per_request": args.records,
        "seconds": args.seconds,
        "emitted": emitted,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--records", type=int, default=50, help="records per request")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--json", action="store_true", help="only the JSON line")
    args = parser.parse_args()
    os.environ.setdefault(TOKEN_ENV, "bench-token")
    result = asyncio.run(_bench(args))
    if not args.json:
        print(f"{result['records_per_s']:.0f} records/s, {result['requests_per_s']:.0f} req/s")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
