"""The webhook (``http``) source is exactly-once through failures: real peer processes,
a client that behaves as a device does (each request sent again, with the same
``Idempotency-Key``, until it is answered 2xx: a refused connection, a timeout, 429
and 5xx are tried again).

The app counts readings per key as they come (a running ``count`` on edge-1, into a
JSONL file on gateway-1): one reading lost or repeated changes every count after it,
so the file equals the plain-Python reference only if each reading reached the app
exactly once. Mid-run, (i) the count's peer is killed (the source's peer lives: its
log replays what came after the last checkpoint, and logs what arrives while the app
is being restored), and (ii) the source's own peer is killed and started again on its
state directory (its log is found again; the client's requests meanwhile are refused
and sent again).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.apps import normalise, read_jsonl
from support.processes import free_port, poll
from support.sinksite import EDGE_1, SENSOR_1, counted, five_peers, status, submit

from agiledart.app import parse_spec
from agiledart.emulation import LocalCluster
from agiledart.local.reference import canonical, reference_outputs

pytestmark = [pytest.mark.processes]

TOKEN = "webhook-t0ken"
KEYS = 8
COUNT = 3000
PER_REQUEST = 25


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalCluster]:
    monkeypatch.setenv("AGILEDART_SECRET_WEBHOOK", TOKEN)  # the peers inherit it
    with five_peers(tmp_path) as cluster:
        yield cluster


def reading(i: int) -> dict[str, Any]:
    return {"key": f"k{i % KEYS}", "seq": i, "ts": 1_000_000 + 2 * i}


class Device:
    """POSTs the readings in requests of ``PER_REQUEST``, at ``rate`` readings a
    second, each request sent again (same key) until a 2xx; from its own thread."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.retries = 0

    def post(self, first: int) -> None:
        body = json.dumps([reading(i) for i in range(first, first + PER_REQUEST)]).encode()
        headers = {
            "Authorization": f"Bearer {TOKEN}",
            "Content-Type": "application/json",
            "Idempotency-Key": f"readings-{first}",
        }
        for _ in range(1200):
            try:
                request = urllib.request.Request(self.url, body, headers, method="POST")
                with urllib.request.urlopen(request, timeout=5) as resp:
                    if 200 <= resp.status < 300:
                        return
            except urllib.error.HTTPError as e:
                if e.code != 429 and e.code < 500:
                    raise
            except (OSError, urllib.error.URLError):
                pass  # not listening (yet, or again), reset, timed out
            self.retries += 1
            time.sleep(0.05)
        raise AssertionError(f"readings from {first}: never taken")

    def start(self, rate: float) -> None:
        def run() -> None:
            t0 = time.monotonic()
            try:
                for first in range(0, COUNT, PER_REQUEST):
                    self.post(first)
                    ahead = t0 + (first + PER_REQUEST) / rate - time.monotonic()
                    if ahead > 0:
                        time.sleep(ahead)
            except BaseException as exc:
                self.error = exc

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def join(self) -> None:
        assert self.thread is not None
        self.thread.join(timeout=120)
        assert not self.thread.is_alive()
        assert self.error is None, self.error


def counting(name: str, port: int) -> dict[str, Any]:
    return counted(
        name,
        "http",
        {
            "port": port,
            "path": "/readings",
            "token_env": "AGILEDART_SECRET_WEBHOOK",
            "count": COUNT,
        },
    )


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("fault", "peer"), [("killed", EDGE_1), ("restarted", SENSOR_1)])
def test_a_peer_fails_mid_run_and_every_posted_reading_counts_once(
    site: LocalCluster, fault: str, peer: int
) -> None:
    port = free_port()
    spec_raw = counting(f"webhook-{fault}", port)
    app_id = submit(site, spec_raw)
    device = Device(f"http://127.0.0.1:{port}/readings")
    device.start(rate=500)  # 6 s: on through the failure and the restore

    def committed() -> bool:
        s = status(site, app_id)
        return s["checkpoint"] is not None and s["totals"]["sink_records"] > 600

    poll(committed, what="a committed checkpoint", timeout=120)
    if fault == "killed":
        site.kill(peer)
    else:
        site.restart(peer)
    device.join()

    def done() -> dict[str, Any] | None:
        s = status(site, app_id)
        return s if s["state"] in ("finished", "failed", "stopped") else None

    s = poll(done, what=f"{app_id} to end", timeout=120)
    assert s["state"] == "finished", s.get("error")
    assert [e["dead"] for e in s["recoveries"]] == [site.name(peer)]
    inputs = {"readings": [reading(i) for i in range(COUNT)]}
    want = normalise(reference_outputs(parse_spec(spec_raw), inputs=inputs)["out"])
    got = read_jsonl(Path(s["peers"]["gateway-1"]["sinks"]["out"]["path"]))
    assert len(got) == len(want)
    assert canonical(got) == canonical(want)
