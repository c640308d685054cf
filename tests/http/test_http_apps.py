"""The http sink in real apps: real peer processes on loopback POSTing to a real
aiohttp receiver in the test process (tests/support/webhook.py); a keyed window whose
every result is a sum over its key's records. After the receiver drops repeated
``Idempotency-Key`` values, what it kept is exactly the plain-Python reference, in
epoch order, when it answers 503 for a while (the sink's peer restarting meanwhile)
and when the window's peer dies; a 400 fails the app with the receiver's reason."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.apps import normalise
from support.processes import cli, poll
from support.sinksite import EDGE_1, GATEWAY_1, GATEWAY_2, finished, five_peers, status, submit, via
from support.sinksite import windows as site_windows
from support.webhook import Receiver, running_receiver

from agiledart.app import parse_spec
from agiledart.emulation import LocalCluster
from agiledart.local.reference import canonical, reference_outputs

pytestmark = [pytest.mark.processes]

TOKEN = "t0ken-for-the-receiver"


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalCluster]:
    monkeypatch.setenv("AGILEDART_SECRET_HOOK", TOKEN)  # the peers inherit it
    with five_peers(tmp_path) as cluster:
        yield cluster


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with running_receiver() as r:
        yield r


def windows(name: str, url: str, count: int = 12_000) -> dict[str, Any]:
    """The site's app into an http sink on gateway-1 (7 records a POST)."""
    params = {"url": url, "token_env": "AGILEDART_SECRET_HOOK", "batch_records": 7}
    return site_windows(name, "http", params, count=count)


def epoch_order(keys: list[str | None]) -> list[tuple[float, int]]:
    """Each key's (epoch, batch); the final batches after every epoch."""
    out = []
    for key in keys:
        assert key is not None
        *_, epoch, batch = key.split("/")
        out.append((float("inf") if epoch == "final" else int(epoch), int(batch)))
    return out


def check_received(spec_raw: dict[str, Any], receiver: Receiver) -> None:
    want = normalise(reference_outputs(parse_spec(spec_raw))["out"])
    got = receiver.records()
    assert len(got) == len(want)
    assert canonical(got) == canonical(want)
    order = epoch_order([r.key for r in receiver.taken()])
    assert order == sorted(order)  # in order
    assert {r.authorization for r in receiver.requests} == {f"Bearer {TOKEN}"}


def test_a_503_outage_and_a_restart_of_the_sinks_peer_lose_nothing(
    site: LocalCluster, receiver: Receiver
) -> None:
    """The endpoint answers 503 while the app runs: committed epochs wait on the sink's
    peer's disk (status shows them), survive that peer's restart (``kill -9``, started
    again with its state directory; or, declared dead first, the sink's move) and go
    out in order once the endpoint is back."""
    receiver.status = 503
    spec_raw = windows("http_outage", receiver.url)
    app_id = submit(site, spec_raw, through=GATEWAY_2)

    def waiting() -> dict[str, Any] | None:
        info = status(site, app_id, GATEWAY_2)["peers"]["gateway-1"]["sinks"]["out"]
        ok = info["connection"] == "retrying" and info["buffered_rows"] > 0
        return info if ok else None

    info = poll(waiting, what="records waiting for the endpoint", timeout=60)
    assert "503" in info["last_error"]
    assert info["buffer_overflows"] == 0
    text = cli(site, "status", app_id, "--via", via(site, GATEWAY_2))
    assert "rows wait on disk" in text.stdout
    assert "retrying since" in text.stdout
    site.restart(GATEWAY_1)  # the outage goes on; the spool outlives the peer
    time.sleep(1)
    receiver.status = 200
    s = finished(site, app_id, through=GATEWAY_2)
    assert s["state"] == "finished", s.get("error")
    assert [e["dead"] for e in s["recoveries"]] == ["gateway-1"]
    # declared dead before it came back, it lost the sink to another peer (what the
    # sink held went along with the checkpoint): wherever the sink runs now
    out = s["peers"][s["sinks"]["out"]]["sinks"]["out"]
    assert out["connection"] == "connected"
    assert out["buffered_rows"] == 0
    assert receiver.answered(503) > 0
    check_received(spec_raw, receiver)


def test_the_received_records_are_exact_when_the_windows_peer_dies(
    site: LocalCluster, receiver: Receiver
) -> None:
    spec_raw = windows("http_kill", receiver.url)
    app_id = submit(site, spec_raw, through=GATEWAY_2)

    def committed() -> bool:
        s = status(site, app_id, GATEWAY_2)
        return s["checkpoint"] is not None and s["totals"]["sink_records"] > 0

    poll(committed, what="a committed epoch's records", timeout=120)
    time.sleep(1.2)  # windows pass the sink after that epoch: the failure cuts them off
    site.kill(EDGE_1)
    s = finished(site, app_id, through=GATEWAY_2)
    assert s["state"] == "finished", s.get("error")
    (event,) = s["recoveries"]
    assert event["mode"] == "checkpoint"
    check_received(spec_raw, receiver)


def test_a_400_fails_the_app_with_the_endpoints_reason(
    site: LocalCluster, receiver: Receiver
) -> None:
    receiver.status, receiver.reason = 400, "schema mismatch: no field 'value'"
    app_id = submit(site, windows("http_refused", receiver.url, count=2_000), through=GATEWAY_2)
    s = finished(site, app_id, through=GATEWAY_2)
    assert s["state"] == "failed"
    assert "HTTP 400 Bad Request: schema mismatch: no field 'value'" in s["error"]
    assert site.procs[GATEWAY_1].poll() is None  # the peer stays up
