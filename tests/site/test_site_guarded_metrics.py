"""The metrics endpoint of a real peer, guarded: a token it asks for (401 without, 403
with a wrong one), a crowd of slow clients that cannot keep a scrape out, and a peer that
refuses to serve metrics beyond loopback without a token."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.processes import clusters, free_port, poll

from agiledart.emulation import LocalCluster
from agiledart.overlay.keys import make_key_text
from agiledart.site import dashboard_token
from agiledart.site.service import metrics_host

pytestmark = [pytest.mark.processes]

TOKEN = "metrics-token-0123456789abcdef"
SLOW = 40  #: more than the endpoint's 32 places


@pytest.fixture(scope="module")
def peer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, int]]:
    root = tmp_path_factory.mktemp("guarded")
    token_file = root / "metrics.token"
    token_file.write_text(TOKEN + "\n")
    port = free_port()
    args = ["--workers", "0", "--metrics-port", str(port), "--metrics-token-file", str(token_file)]
    args += ["--dashboard-port", str(free_port()), "--show-dashboard-url"]
    with clusters(root) as make:
        cluster = make(1, args)
        wait_serving(cluster.address(0)[0], port)
        yield cluster, port


def wait_serving(host: str, port: int) -> None:
    for _ in range(200):
        try:
            socket.create_connection((host, port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError("the metrics endpoint never came up")


def scrape(host: str, port: int, auth: str | None) -> tuple[int, str]:
    headers = {} if auth is None else {"Authorization": auth}
    request = urllib.request.Request(f"http://{host}:{port}/metrics", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=20) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read().decode()


def test_without_the_token_a_scrape_is_refused(peer: tuple[LocalCluster, int]) -> None:
    cluster, port = peer
    host = cluster.address(0)[0]
    status, body = scrape(host, port, None)
    assert status == 401
    assert "Bearer" in body
    assert scrape(host, port, "Bearer " + "x" * len(TOKEN))[0] == 403
    assert scrape(host, port, "Basic " + TOKEN)[0] == 401
    status, text = scrape(host, port, f"Bearer {TOKEN}")
    assert status == 200
    names = {f.name for f in text_string_to_metric_families(text)}
    assert "agiledart_peer_info" in names


def test_slow_connections_do_not_keep_a_scrape_out(peer: tuple[LocalCluster, int]) -> None:
    cluster, port = peer
    host = cluster.address(0)[0]
    slow = []
    try:
        for _ in range(SLOW):  # each sends half a head and then nothing
            s = socket.create_connection((host, port), timeout=10)
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            slow.append(s)
        for _ in range(3):
            status, text = scrape(host, port, f"Bearer {TOKEN}")
            assert status == 200
            assert "agiledart_peer_info" in text
        shed = 0
        for s in slow:
            s.settimeout(0.05)
            try:
                shed += s.recv(1) == b""
            except TimeoutError:
                pass  # still waiting: shed later, or timed out by the read deadline
            except OSError:
                shed += 1  # reset
        assert shed >= 3  # one place made for each scrape, from the slow ones
    finally:
        for s in slow:
            s.close()
    assert cluster.procs[0].poll() is None


def test_the_dashboard_url_is_printed_once_on_request_never_logged(
    peer: tuple[LocalCluster, int],
) -> None:
    cluster, _ = peer
    log = cluster.workdir / f"{cluster.name(0)}.log"  # type: ignore[operator]
    out = poll(lambda: "with its token" in (t := log.read_text()) and t, what="the banner")
    token = dashboard_token(cluster.key)
    lines = [line for line in out.splitlines() if token in line]
    assert len(lines) == 1, lines
    assert lines[0].startswith("dashboard URL with its token: http://127.0.0.1:")
    assert "agiledart dashboard-url --via" in out  # the hint the log has instead


def test_metrics_beyond_loopback_need_a_token(tmp_path: Path) -> None:
    key = tmp_path / "cluster.key"
    key.write_text(make_key_text() + "\n")
    key.chmod(0o600)
    env = {k: v for k, v in os.environ.items() if k != "AGILEDART_METRICS_TOKEN"}
    cmd = [
        sys.executable,
        "-m",
        "agiledart.cli",
        "peer",
        "--listen",
        f"127.0.0.1:{free_port()}",
        "--state-dir",
        str(tmp_path / "state"),
        "--cluster-key-file",
        str(key),
        "--workers",
        "0",
        "--metrics-port",
        str(free_port()),
        "--metrics-host",
        "0.0.0.0",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 1
    assert "serving metrics beyond loopback (on 0.0.0.0) needs a token" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_metrics_listen_on_loopback_unless_told() -> None:
    assert metrics_host("0.0.0.0", None) == "127.0.0.1"
    assert metrics_host("192.168.1.20", None) == "127.0.0.1"
    assert metrics_host("127.0.0.5", None) == "127.0.0.5"
    assert metrics_host("0.0.0.0", "0.0.0.0") == "0.0.0.0"
