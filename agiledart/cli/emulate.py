"""``agiledart emulate``: a bundled app on a local cluster of real peer processes.

The README's main job. ``agiledart emulate`` validates the app (``--app``, default
``urban-sensing``, with ``--set`` overrides), starts ``--peers`` ``agiledart peer``
processes (each on its own loopback address 127.0.0.2 ..., all on one port, a fresh
cluster key, named ``sensor-1, sensor-2, gateway-1, gateway-2, edge-1 ...`` as the
bundled apps expect), waits until every peer knows every other, and submits the app
through a peer that is neither a source nor a sink of it: any peer takes submissions.

While the app runs, a live view polls ``status`` (throughput, latency, placement,
JOIN paths) and ``ring`` (which peers host it). The run ends when the app finishes,
after ``--duration`` seconds, or on Ctrl-C (SIGINT or SIGTERM), whichever comes
first; a live app is then stopped. A summary follows, and no process is left behind.
The working directory (cluster key, peer logs, the sinks' output files) is kept.

:func:`progress_view` and :func:`summarize` are plain functions over ``status`` and
``ring`` answers; :func:`_emulate` is the driver around them, and the peers are a
:class:`~agiledart.emulation.LocalCluster`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from agiledart.app.errors import AppError
from agiledart.app.parse import parse_spec
from agiledart.app.spec import AppSpec
from agiledart.emulation import PORT, LocalCluster, site_name
from agiledart.errors import AgiledartError

__all__ = ["Progress", "add_parser", "progress_view", "summarize", "summary_text"]

DEFAULT_APP = "urban-sensing"
POLL_S = 0.5  #: seconds between ``status`` polls
RING_EVERY = 4  #: ``ring`` is polled on every 4th ``status`` poll
MAX_POLL_FAILURES = 20  #: consecutive failed ``status`` polls before giving up
TERMINAL = ("finished", "failed", "stopped")

T = TypeVar("T")


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "emulate",
        help="run a bundled app on a local cluster of peers, live",
        description="Start N peer processes on 127.0.0.x, run an app on them (by default "
        "the bundled urban-sensing app) with a live view of throughput, latency and "
        "placement, and print a summary. Ends when the app finishes, after --duration "
        "seconds, or on Ctrl-C. The peers' state, logs, cluster key and the sinks' output "
        "files go to --work-dir (kept), else to a temporary directory that is removed at "
        "the end unless --keep is given or the app failed.",
    )
    p.add_argument(
        "--peers",
        type=int,
        help="peer processes (default 8, or as many as --links names)",
    )
    p.add_argument(
        "--app",
        default=DEFAULT_APP,
        help=f"a bundled app's name or an app spec file (default {DEFAULT_APP})",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a spec value, as `agiledart submit --set` (repeatable)",
    )
    p.add_argument(
        "--duration",
        type=float,
        default=60.0,
        help="seconds the app may run before it is stopped (default 60; a finite app "
        "ends the run when it finishes)",
    )
    p.add_argument(
        "--links",
        type=Path,
        metavar="FILE",
        help="emulated network (docs/bandit-graphs.md format; nodes are peer names: "
        "sensor-1, sensor-2, gateway-1, gateway-2, edge-1, ...): per-link loss and delay, "
        "and data between peers that are not neighbours relayed hop by hop (KL-UCB)",
    )
    p.add_argument(
        "--trace-dir",
        type=Path,
        help="the peers write traces here (docs/traces.md), for `agiledart analyze`",
    )
    p.add_argument(
        "--work-dir",
        type=Path,
        metavar="DIR",
        help="keep the peers' state, logs, cluster key and outputs in DIR (created)",
    )
    p.add_argument(
        "--keep",
        action="store_true",
        help="keep the temporary directory (without --work-dir) after the run",
    )
    p.add_argument("--port", type=int, default=PORT, help=f"port of every peer (default {PORT})")
    p.add_argument(
        "--json",
        action="store_true",
        help="print the summary as one JSON object on stdout (the live view goes to stderr)",
    )
    p.set_defaults(func=_cmd_emulate)


# -- what is shown: plain functions over `status` and `ring` answers ----------------------


@dataclass
class Progress:
    """What the live view and the summary are made of; :meth:`observe` takes each poll.

    The driver replaces fields, never mutates them in place, so the live view's refresh
    thread always renders a consistent value.
    """

    app: str
    names: tuple[str, ...]  #: the peers, in start order
    via: str
    duration: float
    started: float = 0.0  #: monotonic time the app was submitted
    app_id: str | None = None
    status: dict[str, Any] = field(default_factory=dict)
    rings: list[dict[str, Any] | None] = field(default_factory=list)
    rate: float | None = None  #: source records/s over the last poll interval
    note: str = ""  #: why the last poll failed, if it did
    ended: float | None = None  #: monotonic time the run ended
    interrupted: bool = False
    _last: tuple[float, int] | None = None

    def observe(self, status: dict[str, Any], now: float) -> None:
        records = int(status.get("totals", {}).get("source_records", 0))
        if self._last is not None and now > self._last[0]:
            self.rate = max(0.0, (records - self._last[1]) / (now - self._last[0]))
        self._last = (now, records)
        self.status = status
        self.note = ""

    @property
    def state(self) -> str:
        if self.status:
            return str(self.status["state"])
        return "submitted" if self.app_id else "not submitted"


def unique_paths(status: dict[str, Any]) -> list[list[str]]:
    """The JOIN paths, each once (a source feeding two sinks on one peer repeats one)."""
    out: list[list[str]] = []
    for path in status.get("paths", []):
        if list(path) not in out:
            out.append(list(path))
    return out


def hosted(status: dict[str, Any]) -> dict[str, list[str]]:
    """Peer name -> the app's sources, operators and sinks placed there."""
    out: dict[str, list[str]] = {}
    for node, peer in status.get("sources", {}).items():
        out.setdefault(peer, []).append(node)
    for op, peers in status.get("placement", {}).items():
        for peer in peers:
            out.setdefault(peer, []).append(op)
    for node, peer in status.get("sinks", {}).items():
        out.setdefault(peer, []).append(node)
    return out


def sink_outputs(status: dict[str, Any]) -> dict[str, str | None]:
    """Sink id -> the file its peer wrote (None for a sink that writes no file)."""
    out: dict[str, str | None] = dict.fromkeys(status.get("sinks", {}))
    for peer_stats in status.get("peers", {}).values():
        if isinstance(peer_stats, dict):
            for sink, info in peer_stats.get("sinks", {}).items():
                out[sink] = info.get("path")
    return out


def _ms(value: Any) -> str:
    return "-" if value is None else f"{value:.1f} ms"


def progress_view(p: Progress, now: float, *, wide: bool = True) -> Group:
    """The live view at monotonic time ``now``; placement and ring side by side if
    ``wide``."""
    s = p.status
    t = s.get("totals", {})
    live = p.state not in TERMINAL and p.ended is None
    elapsed = (p.ended or now) - p.started if p.started else 0.0
    head = Text.assemble(
        (p.app_id or p.app, "bold"),
        "  ",
        (p.state, "bold green" if p.state in ("running", "finished") else "bold yellow"),
        f"  {elapsed:.1f} s",
        f" (stops in {max(0.0, p.duration - elapsed):.0f} s)" if live else "",
        f"  via {p.via}",
    )
    lines = [head]
    if t:
        now_rate = f"  {p.rate:,.0f}/s now" if live and p.rate is not None else ""
        lines += [
            Text(
                f"in  {t['source_records']:>9,} records  "
                f"{t.get('source_rate', 0.0):,.0f}/s mean{now_rate}"
            ),
            Text(
                f"out {t['sink_records']:>9,} records  latency p50 "
                f"{_ms(t.get('latency_p50_ms'))}, p99 {_ms(t.get('latency_p99_ms'))}"
            ),
            Text(
                f"delayed {t['delayed']:,}  shed {t['shed']:,}  late {t['late']:,}  "
                f"errors {t['errors']:,}"
            ),
        ]
    lines += [Text(f"error: {s['error']}", style="red")] if s.get("error") else []
    lines += [Text(p.note, style="yellow")] if p.note else []
    paths = unique_paths(s)
    if paths:
        lines.append(Text("JOIN paths: " + ";  ".join(" -> ".join(x) for x in paths)))
    tables = (_placement_table(s), _ring_table(p))
    if not wide:
        return Group(*lines, *tables)
    grid = Table.grid(padding=(0, 4))
    grid.add_row(*tables)
    return Group(*lines, grid)


def _table(title: str, *columns: str) -> Table:
    table = Table(title=title, box=box.SIMPLE_HEAD, show_edge=False, title_justify="left")
    for col in columns:
        table.add_column(col, no_wrap=True)
    return table


def _placement_table(s: dict[str, Any]) -> Table:
    table = _table("placement", "node", "peers")
    for node, peer in s.get("sources", {}).items():
        table.add_row(f"{node} (source)", peer)
    for op, peers in s.get("placement", {}).items():
        table.add_row(op, ", ".join(peers))
    for node, peer in s.get("sinks", {}).items():
        table.add_row(f"{node} (sink)", peer)
    return table


def _ring_table(p: Progress) -> Table:
    table = _table("ring", "peer", "address", "knows", "hosting")
    here = hosted(p.status)
    for name, r in zip(p.names, p.rings, strict=False):
        if r is None:
            table.add_row(name, "-", "-", "down")
            continue
        apps = list(r.get("apps", ()))
        mine = here.get(name, []) if p.app_id in apps else []
        others = len(apps) - (p.app_id in apps)
        hosting = ", ".join(mine) + (f" +{others} apps" if others > 0 else "")
        table.add_row(name, r["address"], str(len(r["peers"])), hosting or "-")
    return table


def summarize(p: Progress, *, workdir: Path, wall_s: float) -> dict[str, Any]:
    """The summary (``--json`` prints it as is)."""
    s, t = p.status, p.status.get("totals", {})
    run_s = (p.ended or p.started) - p.started if p.started else 0.0
    return {
        "app": s.get("name", p.app),
        "app_id": p.app_id,
        "state": p.state,
        "error": s.get("error"),
        "note": p.note or None,
        "interrupted": p.interrupted,
        "peers": len(p.names),
        "submitted_via": p.via,
        "records_in": t.get("source_records", 0),
        "records_out": t.get("sink_records", 0),
        "delayed": t.get("delayed", 0),
        "shed": t.get("shed", 0),
        "late": t.get("late", 0),
        "errors": t.get("errors", 0),
        "mean_throughput_rps": t.get("source_rate", 0.0),
        "latency_p50_ms": t.get("latency_p50_ms"),
        "latency_p99_ms": t.get("latency_p99_ms"),
        "placement": s.get("placement", {}),
        "sources": s.get("sources", {}),
        "sinks": s.get("sinks", {}),
        "paths": unique_paths(s),
        "outputs": sink_outputs(s),
        "relay": relay_totals(p.rings),
        "workdir": str(workdir),
        "run_s": round(run_s, 2),
        "wall_s": round(wall_s, 2),
    }


def relay_totals(rings: list[dict[str, Any] | None]) -> dict[str, int] | None:
    """The relay layer's counters summed over the peers (None: no link model)."""
    total: dict[str, int] = {}
    for ring in rings:
        relay = (ring or {}).get("relay")
        if isinstance(relay, dict):
            for k, v in relay.get("stats", {}).items():
                total[k] = total.get(k, 0) + int(v)
    return total or None


def summary_text(x: dict[str, Any]) -> str:
    """The summary for people."""
    how = " (Ctrl-C)" if x["interrupted"] else ""
    ran = (
        f" after {x['run_s']:.1f} s on {x['peers']} peers, submitted through {x['submitted_via']}"
        if x["app_id"]
        else f" on {x['peers']} peers"
    )
    lines = [
        f"summary: {x['app_id'] or x['app']} {x['state']}{how}{ran}; "
        f"wall time {x['wall_s']:.1f} s with start-up and teardown"
    ]
    lines += [f"  {k}: {x[k]}" for k in ("error", "note") if x[k]]
    lines += [
        f"  records: {x['records_in']:,} in ({x['mean_throughput_rps']:,.0f}/s mean), "
        f"{x['records_out']:,} out; {x['delayed']:,} delayed, {x['shed']:,} shed, "
        f"{x['late']:,} late, {x['errors']:,} errors",
        f"  latency source to sink: p50 {_ms(x['latency_p50_ms'])}, p99 {_ms(x['latency_p99_ms'])}",
    ]
    lines += [f"  source {n} @ {peer}" for n, peer in x["sources"].items()]
    lines += [f"  operator {op} @ {', '.join(ps)}" for op, ps in x["placement"].items()]
    kept = x.get("kept", True)
    lines += [
        f"  sink {n} @ {peer}: {(x['outputs'].get(n) or '-') if kept else '(removed)'}"
        for n, peer in x["sinks"].items()
    ]
    lines += [f"  path: {' -> '.join(path)}" for path in x["paths"]]
    r = x.get("relay")
    if r:
        lines.append(
            f"  relayed: {r['sent']:,} packets, {r['delivered']:,} delivered, "
            f"{r['attempts']:,} attempts ({r['failures']:,} lost), {r['forwarded']:,} relay hops, "
            f"{r['duplicates']:,} duplicates dropped"
        )
    if x.get("trace_dir"):
        lines.append(f"  traces: {x['trace_dir']}  (agiledart analyze {x['trace_dir']} --out DIR)")
    if kept:
        lines.append(f"  peer logs, cluster key and outputs: {x['workdir']}")
    else:
        lines.append("  peer logs and outputs removed (keep them with --work-dir DIR or --keep)")
    return "\n".join(lines)


# -- the driver -------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class _Run:
    spec: AppSpec
    text: str
    overrides: list[str]
    duration: float


def _spec_text(app: str) -> str:
    from agiledart import apps

    if os.path.exists(app):
        try:
            return Path(app).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            msg = f"cannot read {app}: {exc}"
            raise AppError(msg) from None
    if app.removesuffix(".yaml") in apps.names():
        return apps.text(app)
    msg = f"{app!r} is neither a file nor a bundled app; bundled apps: {', '.join(apps.names())}"
    raise AppError(msg)


def _peers_for_links(path: Path) -> int:
    """How many site peers a link file needs: its nodes must be site names."""
    from agiledart.bandit.errors import GraphError
    from agiledart.runtime.linkmodel import LinkModel

    try:
        model = LinkModel.load(path)
    except GraphError as exc:
        msg = f"--links {path}: {exc}"
        raise AgiledartError(msg) from None
    index = {site_name(i): i for i in range(250)}
    unknown = [n for n in model.peers if n not in index]
    if unknown:
        msg = (
            f"--links {path}: nodes {unknown} are not peer names of an emulated site "
            f"({', '.join(site_name(i) for i in range(6))}, ...)"
        )
        raise AgiledartError(msg)
    return max(index[n] for n in model.peers) + 1


def submit_peer(cluster: LocalCluster, spec: AppSpec) -> int:
    """The last peer that is neither a source nor a sink of ``spec`` (else the last)."""
    pinned = {s.peer for s in spec.sources} | {k.peer for k in spec.sinks}
    free = [i for i in range(cluster.peers) if cluster.name(i) not in pinned]
    return free[-1] if free else cluster.peers - 1


def _cmd_emulate(args: argparse.Namespace) -> int:
    if args.duration <= 0:
        msg = "--duration must be positive"
        raise AgiledartError(msg)
    extra: list[str] = []
    peers = args.peers
    if args.links is not None:
        needed = _peers_for_links(args.links)
        if peers is not None and peers < needed:
            msg = f"--links names {needed} peers' worth of sites; --peers {peers} is too few"
            raise AgiledartError(msg)
        peers = peers or needed
        extra += ["--links", str(args.links.resolve())]
    if args.trace_dir is not None:
        args.trace_dir.mkdir(parents=True, exist_ok=True)
        extra += ["--trace-dir", str(args.trace_dir.resolve())]
    cluster = LocalCluster(peers or 8, port=args.port, extra_args=extra)
    text = _spec_text(args.app)
    names = [cluster.name(i) for i in range(cluster.peers)]
    spec = parse_spec(text, overrides=args.set, known_peers=names)  # fail before any peer
    run = _Run(spec=spec, text=text, overrides=list(args.set), duration=args.duration)
    if args.work_dir is not None:
        args.work_dir.mkdir(parents=True, exist_ok=True)
        cluster.workdir = args.work_dir.resolve()
    else:
        cluster.workdir = Path(tempfile.mkdtemp(prefix="agiledart-emulate-"))
    console = Console(stderr=args.json)
    began = time.monotonic()
    progress = asyncio.run(_emulate(cluster, run, console))  # an error keeps the logs
    summary = summarize(progress, workdir=cluster.workdir, wall_s=time.monotonic() - began)
    summary["trace_dir"] = None if args.trace_dir is None else str(args.trace_dir)
    summary["kept"] = args.keep or args.work_dir is not None or summary["state"] == "failed"
    if not summary["kept"]:
        shutil.rmtree(cluster.workdir, ignore_errors=True)
    if not args.json or not console.is_terminal:
        console.line()  # after the live view's last line, which may lack its newline
    if args.json:
        print(json.dumps(summary))
    else:
        shown = Text(summary_text(summary))
        shown.stylize("bold", 0, len("summary"))
        console.print(shown, soft_wrap=True)
    if summary["state"] == "failed":
        msg = f"app {summary['app_id']} failed: {summary['error']}"
        raise AppError(msg)
    return 0


async def _emulate(cluster: LocalCluster, run: _Run, console: Console) -> Progress:
    """Start the peers, run the app, tear everything down; Ctrl-C (SIGINT) or SIGTERM
    only ends the run early. The peers are down when this returns."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    via = submit_peer(cluster, run.spec)
    names = tuple(cluster.name(i) for i in range(cluster.peers))
    p = Progress(app=run.spec.name, names=names, via=cluster.name(via), duration=run.duration)
    try:
        with cluster:
            with console.status(f"starting {cluster.peers} peers on 127.0.0.x:{cluster.port} ..."):
                t0 = time.monotonic()
                formed = await _unless(stop, cluster.wait_formed())
            if formed is None:
                p.interrupted = True
            else:
                console.print(
                    f"{cluster.peers} peers up in {time.monotonic() - t0:.1f} s; "
                    f"running {run.spec.name} for at most {run.duration:g} s",
                    highlight=False,
                )
                await _run_app(cluster, via, run, p, stop, console)
            if p.ended is None:
                p.ended = time.monotonic()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    return p


async def _run_app(
    cluster: LocalCluster, via: int, run: _Run, p: Progress, stop: asyncio.Event, console: Console
) -> None:
    body = {"spec": run.text, "set": run.overrides}
    res = await cluster.request(via, "submit", body, timeout=60.0)
    p.started, p.app_id = time.monotonic(), str(res["app_id"])
    host, port = cluster.address(via)
    console.print(f"submitted {p.app_id} through {p.via} ({host}:{port})", highlight=False)
    with Live(
        console=console,
        refresh_per_second=2,
        get_renderable=lambda: progress_view(p, time.monotonic(), wide=console.width >= 100),
    ):
        await _follow(cluster, via, p, stop)
        p.ended, p.interrupted = time.monotonic(), stop.is_set()
        try:
            if p.state not in TERMINAL:
                await cluster.request(via, "stop", {"app_id": p.app_id}, timeout=30.0)
            p.observe(await _status(cluster, via, p), time.monotonic())
        except AgiledartError as exc:  # still a summary, saying what went wrong
            p.note = f"could not stop {p.app_id} or read its final status: {exc}"
        p.rings = await asyncio.gather(*(cluster.ring(i) for i in range(cluster.peers)))


async def _follow(cluster: LocalCluster, via: int, p: Progress, stop: asyncio.Event) -> None:
    """Poll until the app ends, ``duration`` has passed, or ``stop`` is set."""
    polls = failures = 0
    deadline = p.started + p.duration
    while not stop.is_set():
        try:
            status = await _status(cluster, via, p)
        except AgiledartError as exc:
            failures += 1
            if failures >= MAX_POLL_FAILURES:
                msg = f"lost contact with {p.via}: {exc}"
                raise AgiledartError(msg) from exc
            p.note = f"status unavailable: {exc}"
        else:
            failures = 0
            p.observe(status, time.monotonic())
        if polls % RING_EVERY == 0:
            p.rings = await asyncio.gather(*(cluster.ring(i) for i in range(cluster.peers)))
        polls += 1
        left = deadline - time.monotonic()
        if p.state in TERMINAL or left <= 0:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(min(POLL_S, left)):
                await stop.wait()


async def _status(cluster: LocalCluster, via: int, p: Progress) -> dict[str, Any]:
    status: dict[str, Any] = await cluster.request(
        via, "status", {"app_id": p.app_id}, timeout=10.0
    )
    return status


async def _unless(stop: asyncio.Event, work: Coroutine[Any, Any, T]) -> T | None:
    """``work``'s result, or None when ``stop`` is set first (``work`` is cancelled)."""
    task = asyncio.create_task(work)
    halt = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({task, halt}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (task, halt):
            t.cancel()
        await asyncio.gather(task, halt, return_exceptions=True)
    return None if task.cancelled() else task.result()


if __name__ == "__main__":  # pragma: no cover
    os.execvp(sys.executable, [sys.executable, "-m", "agiledart.cli", "emulate", *sys.argv[1:]])
