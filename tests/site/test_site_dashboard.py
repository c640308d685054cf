"""The dashboard of a real peer: refused without its token, robust to bad HTTP, and, in a
real headless Chromium, drawing each app's graph with the right peers, following an
app that is stopped, and showing an app's errors (count, error, record, event)."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from support.browser import chromium_path, headless_chromium
from support.processes import cli, poll
from support.site import DASHBOARD, Site

pytestmark = [pytest.mark.processes, pytest.mark.slow]


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, headers=headers or {}), timeout=20
        ) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read()


def raw(site: Site, data: bytes) -> bytes:
    """Send ``data`` to the dashboard as is; what comes back before it closes."""
    with socket.create_connection(("127.0.0.1", site.dashboard_port), timeout=20) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_dashboard_url_command(site: Site) -> None:
    out = cli(site.cluster, "dashboard-url", *site.via()).stdout.strip()
    assert out == site.dashboard_url()
    other = cli(site.cluster, "dashboard-url", *site.via(0), check=False)
    assert other.returncode == 1
    assert "serves no dashboard" in other.stderr


def test_without_the_token_access_is_refused(site: Site) -> None:
    for path in ("/", "/api/state", "/api/ring"):
        status, body = get(site.dashboard_url(token=False, path=path))
        assert status == 401, path
        assert b"token" in body
        status, _ = get(site.dashboard_url(token=False, path=path) + "?token=" + "0" * 32)
        assert status == 403, path
        status, _ = get(
            site.dashboard_url(token=False, path=path), {"Authorization": "Bearer nope"}
        )
        assert status == 403, path
    token = site.dashboard_url().rpartition("=")[2]
    status, body = get(
        site.dashboard_url(token=False, path="/api/state"), {"Authorization": f"Bearer {token}"}
    )
    assert status == 200
    assert json.loads(body)["peer"] == site.cluster.name(DASHBOARD)


def test_the_token_url_gives_a_cookie_and_no_log_holds_the_token(site: Site) -> None:
    token = site.dashboard_url().rpartition("=")[2]
    with urllib.request.urlopen(site.dashboard_url(), timeout=20) as r:
        cookie = r.headers["Set-Cookie"]
    name, _, rest = cookie.partition("=")
    assert rest.split(";")[0] == token
    assert {"HttpOnly", "SameSite=Strict", "Path=/"} <= {a.strip() for a in rest.split(";")}
    status, _ = get(site.dashboard_url(token=False, path="/api/state"), {"Cookie": cookie})
    assert status == 200
    wrong = f"{name}={'0' * 32}"
    assert get(site.dashboard_url(token=False, path="/api/state"), {"Cookie": wrong})[0] == 403
    assert get(site.dashboard_url(token=False), {"Cookie": "other=" + token})[0] == 401
    log = (site.cluster.workdir / f"{site.cluster.name(DASHBOARD)}.log").read_text()  # type: ignore[operator]
    assert token not in log
    assert "agiledart dashboard-url --via" in log


def test_bad_http_gets_a_4xx_and_the_peer_lives_on(site: Site) -> None:
    assert raw(site, b"\x16\x03\x01garbage\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    assert raw(site, b"GET / HTTP/1.1\r\n" + b"X-Big: " + b"a" * 100_000 + b"\r\n\r\n").startswith(
        b"HTTP/1.1 431 "
    )
    assert raw(site, b"POST /api/state HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc").startswith(
        b"HTTP/1.1 405 "
    )
    assert raw(site, b"GET /\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    assert raw(site, b"GET /../../etc/passwd HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 404 ")
    # the metrics endpoint shares the HTTP code: garbage there too
    host = site.cluster.address(DASHBOARD)[0]
    with socket.create_connection((host, site.metrics_port), timeout=20) as s:
        s.sendall(b"\x00" * 20_000)
        s.shutdown(socket.SHUT_WR)
        assert s.recv(100).startswith(b"HTTP/1.1 431 ")
    status, _ = get(site.dashboard_url(path="/api/state"))
    assert status == 200
    assert site.cluster.procs[DASHBOARD].poll() is None


FAULTY = {
    "name": "faulty",
    "sources": [
        {
            "id": "src",
            "peer": "sensor-1",
            "connector": "generator",
            "params": {"dataset": "counter", "rate": 100, "count": 200},
        }
    ],
    "operators": [
        {
            "id": "scaled",
            "op": "map",
            "fn": "builtin:scale",
            "params": {"field": "absent"},
            "inputs": ["src"],
            "on_error": "dead_letter",
            "dead_letter": {"type": "file"},
        }
    ],
    "sinks": [{"id": "out", "peer": "gateway-1", "connector": "discard", "inputs": ["scaled"]}],
}
ERRORS_IN_PAGE = """
(() => {
  const card = document.querySelector('section.app[data-app-id="APP"]');
  if (!card) return null;
  const problems = card.querySelector('[data-role=problems]');
  return {
    errors: card.querySelector('[data-role=errors]').textContent,
    problems: problems ? problems.textContent : "",
  };
})()
"""
APPS_IN_PAGE = """
[...document.querySelectorAll('section.app')].map(card => ({
  app_id: card.dataset.appId,
  state: card.dataset.state,
  nodes: Object.fromEntries([...card.querySelectorAll('g.node')]
    .map(g => [g.dataset.node, g.dataset.peers ? g.dataset.peers.split(',') : []])),
  edges: card.querySelectorAll('path.edge').length,
  paths: [...card.querySelectorAll('li.join-path')].map(li => li.textContent),
}))
"""


def expected_nodes(status: dict[str, Any]) -> dict[str, list[str]]:
    nodes = {s: [p] for s, p in status["sources"].items()}
    nodes |= {k: [p] for k, p in status["sinks"].items()}
    nodes |= {o: list(ps) for o, ps in status["placement"].items()}
    return nodes


def test_dashboard_in_chromium(site: Site, tmp_path: Path) -> None:
    browser_path = chromium_path()
    if browser_path is None:
        pytest.fail("no chromium: install it (apt-get install chromium; scripts/setup.sh does)")
    statuses = {name: site.status(app_id) for name, app_id in site.apps.items()}
    with headless_chromium(browser_path) as browser:
        browser.open(site.dashboard_url())

        def both_apps_drawn() -> list[dict[str, Any]] | None:
            cards = browser.evaluate(APPS_IN_PAGE) or []
            drawn = {c["app_id"] for c in cards if c["nodes"]}
            return cards if set(site.apps.values()) <= drawn else None

        cards = {c["app_id"]: c for c in poll(both_apps_drawn, what="both apps drawn")}
        for status in statuses.values():
            card = cards[status["app_id"]]
            assert card["state"] == "running"
            assert card["nodes"] == expected_nodes(status)
            assert card["edges"] >= len(card["nodes"]) - 1
            assert len(card["paths"]) == len(status["paths"])
            for path, text in zip(status["paths"], card["paths"], strict=True):
                assert text.endswith(" \u2192 ".join(path))
        ring = browser.evaluate(
            "[...document.querySelectorAll('#ring g.ring-peer')].map(g => g.dataset.peer)"
        )
        assert sorted(ring) == sorted(site.cluster.name(i) for i in range(site.cluster.peers))
        assert browser.evaluate("document.querySelectorAll('#ring polyline.join-path').length") > 0
        assert browser.evaluate("document.getElementById('status').textContent") == "live"
        assert browser.evaluate("location.search") == ""  # the token left the URL
        assert "token" not in browser.evaluate("location.href + document.cookie")  # HttpOnly
        browser.screenshot(tmp_path / "dashboard-running.png")

        stopped = site.apps["word-count"]
        cli(site.cluster, "stop", stopped, *site.via(0))

        def shows_stopped() -> bool:
            cards = {c["app_id"]: c for c in browser.evaluate(APPS_IN_PAGE) or []}
            return cards.get(stopped, {}).get("state") == "stopped"

        poll(shows_stopped, what="the page shows the stopped app", timeout=30)
        cards = {c["app_id"]: c for c in browser.evaluate(APPS_IN_PAGE)}
        assert cards[site.apps["urban-sensing"]]["state"] == "running"
        events = browser.evaluate("document.getElementById('events').textContent")
        assert f"app {stopped} (word-count): running -> stopped" in events
        browser.screenshot(tmp_path / "dashboard-stopped.png")
        browser.open(site.dashboard_url(token=False))  # a reload: the cookie lets it in

        def live() -> bool:
            text = browser.evaluate("document.getElementById('status')?.textContent")
            return bool(text == "live")

        poll(live, what="the page live again without the token in its URL", timeout=30)

        # an app whose function raises on every record: its count and error on the page
        faulty = tmp_path / "faulty.yaml"
        faulty.write_text(json.dumps(FAULTY))
        app_id = cli(site.cluster, "submit", str(faulty), *site.via(0)).stdout.strip()

        def shows_errors() -> dict[str, str] | None:
            got = browser.evaluate(ERRORS_IN_PAGE.replace("APP", app_id))
            return got if got and got["errors"] == "200 errors" and got["problems"] else None

        shown = poll(shows_errors, what="the faulty app's errors on the page", timeout=60)
        assert "KeyError: 'absent'" in shown["problems"]
        assert "(e.g. {" in shown["problems"]  # a record that raised it

        def shows_letters() -> str | None:
            got = browser.evaluate(ERRORS_IN_PAGE.replace("APP", app_id))
            text = str(got["problems"]) if got else ""
            return text if "200 sent to its dead-letter sink" in text else None

        letters = poll(shows_letters, what="the faulty app's dead letters on the page", timeout=30)
        assert "scaled: dead letters on " in letters
        assert "scaled-" in letters  # the default path names the operator and the peer
        events = browser.evaluate("document.getElementById('events').textContent")
        assert f"app {app_id}: 200 record(s) dropped by errors (KeyError: 'absent')" in events
        browser.screenshot(tmp_path / "dashboard-errors.png")
