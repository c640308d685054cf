"""The live web dashboard a peer serves (``agiledart peer --dashboard-port P``).

The page (``dashboard.html``, ``.js``, ``.css`` beside this module: vanilla JS, nothing
from the network) polls
``GET /api/state`` every second and draws the ring and leaf sets, zones and app
schedulers, each app's dataflow graph with the peers hosting every node and its JOIN
paths, live throughput and latency, and recent events.

The backend reads what the CLI reads, through the same calls the control RPCs make:
this peer's ``ring`` answer (:meth:`~agiledart.peer.Peer.ring_info`), the ``ring`` RPC
of every peer it knows (over :class:`~agiledart.runtime.links.Links`), and the
scheduler's ``apps`` list and ``status`` of each app, whose record also gives the spec
the graph is drawn from. One view is built at most once per ``refresh_s`` however many
browsers poll, so a dashboard costs the cluster a bounded number of RPCs.

Access: the page and ``/api/*`` need the dashboard token, a value derived from the
cluster key (:func:`dashboard_token`), as ``?token=``, ``Authorization: Bearer`` or the
dashboard's cookie; without it they answer 401, with a wrong one 403. The URL with the
token is only a way in: the page it opens sets the cookie (``HttpOnly``,
``SameSite=Strict``, for this session) and its script takes the token out of the
address bar and the history (``history.replaceState``), so it is not left in the URL
(nor in bookmarks or screenshots); the page then polls with the cookie. Anyone holding
the cluster key can compute the token (``agiledart dashboard-url``). The static JS and
CSS hold no data and are served to anyone. An ``--insecure`` peer's key is public,
hence its token too: such a peer serves its dashboard on a loopback address only
(:class:`~agiledart.site.Site`).
"""

from __future__ import annotations

import asyncio
import collections
import hmac
import importlib.resources
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from agiledart.errors import AgiledartError
from agiledart.overlay.auth import ClusterKey
from agiledart.overlay.leafset import MembershipEvent
from agiledart.site.graph import app_graph, changes, incidents
from agiledart.site.http import Request, Response

if TYPE_CHECKING:
    from agiledart.peer import Peer

log = logging.getLogger(__name__)

__all__ = ["Control", "Dashboard", "DashboardConfig", "PeerControl", "dashboard_token"]

TOKEN_LABEL = b"agiledart-dashboard-token-v1"
TERMINAL = ("finished", "failed", "stopped")
STATIC = {
    "dashboard.html": "text/html; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
}
#: the page runs only its own script and style, talks only to its own peer
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


def dashboard_token(key: ClusterKey) -> str:
    """The dashboard token of a cluster: HMAC-SHA256 under the cluster key of a fixed
    label, 128 bits in hex. Every peer of a cluster has the same one."""
    return key.derive(TOKEN_LABEL)[:16].hex()


class Control(Protocol):
    """Where the dashboard reads from: the answers of ``ring``, ``apps``, ``status``."""

    def ring(self) -> dict[str, Any]: ...

    async def remote_ring(self, address: tuple[str, int], timeout: float) -> dict[str, Any]: ...

    async def apps(self) -> list[dict[str, Any]]: ...

    async def status(self, app_id: str) -> dict[str, Any]: ...

    async def spec(self, app_id: str) -> Any: ...


class PeerControl:
    """:class:`Control` over a live peer: the calls its control RPC handlers make."""

    def __init__(self, peer: Peer) -> None:
        self.peer = peer

    def ring(self) -> dict[str, Any]:
        return self.peer.ring_info()

    async def remote_ring(self, address: tuple[str, int], timeout: float) -> dict[str, Any]:
        answer = await self.peer.links.request(address, "ring", {}, timeout=timeout)
        return answer if isinstance(answer, dict) else {}

    async def apps(self) -> list[dict[str, Any]]:
        return await self.peer.runtime.scheduler.list_apps()

    async def status(self, app_id: str) -> dict[str, Any]:
        return await self.peer.runtime.scheduler.status(app_id)

    async def spec(self, app_id: str) -> Any:
        return (await self.peer.runtime.scheduler.record(app_id)).spec


@dataclass(frozen=True, kw_only=True)
class DashboardConfig:
    refresh_s: float = 1.0  #: a view is rebuilt at most this often
    max_peers: int = 64  #: peers asked for their ring view, at most
    max_apps: int = 20  #: the most recently submitted apps shown
    rpc_timeout_s: float = 3.0
    events: int = 200  #: recent events kept


class Dashboard:
    """The dashboard's HTTP handler and the cluster view behind it."""

    def __init__(
        self,
        control: Control,
        token: str,
        *,
        config: DashboardConfig | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.control = control
        self.token = token
        self.config = config or DashboardConfig()
        self.clock = clock
        self.events: collections.deque[dict[str, Any]] = collections.deque(
            maxlen=self.config.events
        )
        self._static = {name: _read_static(name) for name in STATIC}
        self._lock = asyncio.Lock()
        self._view: dict[str, Any] | None = None
        self._view_at = float("-inf")
        self._last: dict[str, Any] | None = None
        self._specs: dict[str, Any] = {}
        self._final: dict[str, dict[str, Any]] = {}  #: status of apps that ended
        #: the session cookie holding the token (named per port: two dashboards on one
        #: host keep theirs apart); the server sets the port once it is bound
        self.cookie = "agiledart_dashboard"

    # -- HTTP --------------------------------------------------------------------------

    async def handle(self, request: Request) -> Response:
        path = request.path
        if path.startswith("/static/"):
            name = path.removeprefix("/static/")
            if name in STATIC and name != "dashboard.html":
                return Response(200, self._static[name], content_type=STATIC[name])
            return Response.text(404, "not found\n")
        if path not in ("/", "/index.html", "/api/state", "/api/ring"):
            return Response.text(404, "not found\n")
        refused = self._refuse(request)
        if refused is not None:
            return refused
        if path == "/api/state":
            return _json(await self.state())
        if path == "/api/ring":
            return _json(self.control.ring())
        headers: tuple[tuple[str, str], ...] = (("Content-Security-Policy", CSP),)
        if "token" in request.query:  # the way in: the page goes on with the cookie
            cookie = f"{self.cookie}={self.token}; Path=/; HttpOnly; SameSite=Strict"
            headers += (("Set-Cookie", cookie),)
        return Response(
            200,
            self._static["dashboard.html"],
            content_type=STATIC["dashboard.html"],
            headers=headers,
        )

    def _refuse(self, request: Request) -> Response | None:
        """None when the request carries the token; else the 401 or 403 answer."""
        given = request.query.get("token")
        auth = request.headers.get("authorization", "")
        if given is None and auth[:7].lower() == "bearer ":
            given = auth[7:].strip()
        if given is None:
            given = _cookie(request.headers.get("cookie", ""), self.cookie)
        if not given:
            return Response.text(
                401,
                "the dashboard needs its token: open the URL the peer printed at start-up, "
                "or ask `agiledart dashboard-url --via HOST:PORT`\n",
                headers=(("WWW-Authenticate", 'Bearer realm="agiledart"'),),
            )
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            return Response.text(403, "wrong dashboard token\n")
        return None

    # -- events ------------------------------------------------------------------------

    def note(self, text: str) -> None:
        self.events.append({"t": self.clock(), "text": text})

    def on_membership(self, event: MembershipEvent) -> None:
        c = event.contact
        self.note(f"leaf set: {c.name or f'{c.node_id:040x}'[:8]} {event.kind.value}")

    # -- the cluster view --------------------------------------------------------------

    async def state(self) -> dict[str, Any]:
        async with self._lock:
            if self._view is None or self.clock() - self._view_at >= self.config.refresh_s:
                self._view = await self._build()
                self._view_at = self.clock()
            return self._view

    async def _build(self) -> dict[str, Any]:
        me = self.control.ring()
        peers = await self._peers(me)
        listed = await self._list_apps()
        shown = {a["app_id"] for a in listed}  # the caches keep what is shown, no more
        self._specs = {k: v for k, v in self._specs.items() if k in shown}
        self._final = {k: v for k, v in self._final.items() if k in shown}
        apps = await asyncio.gather(*(self._app(a) for a in listed))
        summary = {
            "peers": {p["name"]: p["reachable"] for p in peers},
            "apps": {a["app_id"]: (a["name"], a["state"]) for a in apps},
            "incidents": {a["app_id"]: a.pop("_incidents", {}) for a in apps},
        }
        for text in changes(self._last, summary):
            self.note(text)
        self._last = summary
        zones: dict[str, list[str]] = {}
        for p in peers:
            zones.setdefault(p["zone"], []).append(p["name"])
        schedulers: dict[str, int] = {}
        for a in apps:
            if a["state"] not in TERMINAL and a.get("scheduler"):
                schedulers[a["scheduler"]] = schedulers.get(a["scheduler"], 0) + 1
        return {
            "peer": me.get("self"),
            "generated_at": self.clock(),
            "peers": peers,
            "peers_known": len(me.get("peers", [])),
            "zones": {z: sorted(names) for z, names in sorted(zones.items())},
            "schedulers": schedulers,
            "apps": apps,
            "events": list(self.events)[-50:],
        }

    async def _peers(self, me: dict[str, Any]) -> list[dict[str, Any]]:
        known = [p for p in me.get("peers", []) if isinstance(p, dict)]
        known = known[: self.config.max_peers]
        rings = await asyncio.gather(*(self._remote(p.get("address")) for p in known))
        out = [_peer_entry(me, me, is_self=True)]
        for contact, ring in zip(known, rings, strict=True):
            out.append(_peer_entry(contact, ring))
        out.sort(key=lambda p: p["node_id"])
        return out

    async def _remote(self, address: Any) -> dict[str, Any] | None:
        try:
            host, _, port = str(address).rpartition(":")
            return await self.control.remote_ring((host, int(port)), self.config.rpc_timeout_s)
        except (AgiledartError, ValueError):
            return None

    async def _list_apps(self) -> list[dict[str, Any]]:
        try:
            listed = await self.control.apps()
        except AgiledartError as exc:
            self.note(f"cannot list the apps: {exc}")
            return []
        listed = [a for a in listed if isinstance(a, dict) and isinstance(a.get("app_id"), str)]
        listed.sort(key=lambda a: -float(a.get("submitted_at") or 0))
        return listed[: self.config.max_apps]

    async def _app(self, listed: dict[str, Any]) -> dict[str, Any]:
        app_id: str = listed["app_id"]
        entry: dict[str, Any] = {
            "app_id": app_id,
            "name": str(listed.get("name", "?")),
            "state": str(listed.get("state", "unknown")),
            "scheduler": listed.get("scheduler"),
            "submitted_at": listed.get("submitted_at"),
        }
        try:
            async with asyncio.timeout(2 * self.config.rpc_timeout_s):
                status = self._final.get(app_id) or await self.control.status(app_id)
                if app_id not in self._specs:
                    self._specs[app_id] = await self.control.spec(app_id)
        except (AgiledartError, TimeoutError) as exc:
            entry["error"] = str(exc) or type(exc).__name__
            return entry
        if status.get("state") in TERMINAL:
            self._final[app_id] = status
        entry.update(
            state=str(status.get("state", entry["state"])),
            error=status.get("error"),
            totals=status.get("totals", {}),
            paths=status.get("paths", []),
            graph=app_graph(self._specs[app_id], status),
            problems=status.get("problems") or {},
            recoveries=status.get("recoveries") or [],
            _incidents=incidents(status),
        )
        return entry


def _peer_entry(
    contact: dict[str, Any], ring: dict[str, Any] | None, *, is_self: bool = False
) -> dict[str, Any]:
    """One peer as the page shows it: what it says of itself, if it answered."""
    ring = ring or {}
    execution = ring.get("execution") if isinstance(ring.get("execution"), dict) else {}
    return {
        "name": str(ring.get("self") or contact.get("name") or contact.get("self") or "?"),
        "node_id": str(contact.get("node_id", "")),
        "address": str(contact.get("address", "")),
        "self": is_self,
        "reachable": bool(ring),
        "zone": str(ring.get("zone", "?")),
        "rtt_ms": contact.get("rtt_ms"),
        "leaf_set": [str(x) for x in ring.get("leaf_set", [])],
        "known": len(ring.get("peers", [])),
        "apps": [str(x) for x in ring.get("apps", [])],
        "workers": execution.get("workers") if execution else None,
    }


def _cookie(header: str, name: str) -> str | None:
    """The value of cookie ``name`` in a ``Cookie`` header, or None."""
    for part in header.split(";"):
        key, sep, value = part.strip().partition("=")
        if sep and key == name:
            return value
    return None


def _read_static(name: str) -> bytes:
    return (importlib.resources.files("agiledart.site") / name).read_bytes()


def _json(value: Any) -> Response:
    body = json.dumps(value, default=str, separators=(",", ":")).encode()
    return Response(200, body, content_type="application/json")
