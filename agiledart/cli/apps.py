"""The application commands of the CLI: ``register``, ``submit``, ``apps``, ``status``, ``stop``.

Each sends one control RPC to the ``--via`` peer (any peer: the app record lives in the
records store, so every peer can answer for every app).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from agiledart.app.errors import AppError

__all__ = ["add_parsers"]

Call = Callable[[argparse.Namespace, str, dict[str, Any]], Awaitable[Any]]
TERMINAL = ("finished", "failed", "stopped")


def add_parsers(
    sub: Any,
    add_via: Callable[[argparse.ArgumentParser], None],
    call: Call,
    run: Callable[[Any], Any],
) -> None:
    def command(name: str, help: str, description: str) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = sub.add_parser(name, help=help, description=description)
        add_via(p)
        p.add_argument("--json", action="store_true", help="print JSON")
        return p

    p = command(
        "register",
        "register a module or package of functions",
        "Store a Python module (a .py file) or a package (a directory with __init__.py) "
        "under the sha256 of its content, the code id, so apps can use "
        "'<code_id>:<function>'. Registering the same bytes again stores nothing new.",
    )
    p.add_argument("bundle", type=Path, help="a module (bundle.py) or a package directory")
    p.set_defaults(func=lambda a: _register(a, call, run))

    p = command(
        "submit",
        "submit an app",
        "Validate an app spec, place it by JOIN routing and start it. APP is a YAML "
        "file or the name of a bundled app (see `agiledart submit --list`).",
    )
    p.add_argument("app", nargs="?", help="app spec file, or a bundled app's name")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a spec value (params.rate=500, sources.readings-a.peer=pi-3)",
    )
    p.add_argument("--list", action="store_true", help="list the bundled apps and exit")
    p.add_argument(
        "--wait",
        action="store_true",
        help="wait until the app has finished (finite apps) and print its status",
    )
    p.set_defaults(func=lambda a: _submit(a, call, run), timeout=60.0)

    p = command(
        "apps",
        "list the apps",
        "List the apps submitted in the last days (UTC), newest first, with their state.",
    )
    p.add_argument("--days", type=_days, default=7, help="how many days back to list (default: 7)")
    p.add_argument(
        "--limit", type=_positive, default=500, help="list at most this many (default: 500)"
    )
    p.set_defaults(func=lambda a: _apps(a, call, run))

    p = command(
        "status",
        "show an app's state",
        "State, placement (operator -> peers), JOIN paths, rates and latency of an app.",
    )
    p.add_argument("app_id")
    p.set_defaults(func=lambda a: _status(a, call, run))

    p = command("stop", "stop an app", "Tear down every instance of an app on every peer.")
    p.add_argument("app_id")
    p.set_defaults(func=lambda a: _stop(a, call, run))


def _register(args: argparse.Namespace, call: Call, run: Callable[[Any], Any]) -> int:
    from agiledart.runtime.code import Bundle

    path: Path = args.bundle
    try:
        bundle = Bundle.from_path(path)
    except OSError as exc:
        msg = f"cannot read {path}: {exc.strerror or exc}"
        raise AppError(msg) from None
    if bundle.kind == "package":
        body: dict[str, Any] = {"kind": "package", "name": bundle.name, "files": dict(bundle.files)}
    else:
        body = {"source": bundle.files[0][1], "name": path.name}
    res = run(call(args, "register", body))
    if args.json:
        print(json.dumps(res))
    else:
        print(res["code_id"])
        print(
            f"{bundle.kind} {bundle.name}: {res['size']:,} bytes, "
            + ("stored" if res["stored"] else "already registered (nothing stored)"),
            file=sys.stderr,
        )
    return 0


def _spec_text(name: str) -> str:
    from agiledart import apps

    if os.path.exists(name):
        try:
            return Path(name).read_text()
        except (OSError, UnicodeDecodeError) as exc:
            msg = f"cannot read {name}: {exc}"
            raise AppError(msg) from None
    if name in apps.names() or name.removesuffix(".yaml") in apps.names():
        return apps.text(name)
    msg = f"{name!r} is neither a file nor a bundled app; bundled apps: {', '.join(apps.names())}"
    raise AppError(msg)


def _submit(args: argparse.Namespace, call: Call, run: Callable[[Any], Any]) -> int:
    from agiledart import apps

    if args.list:
        for name in apps.names():
            print(name)
        return 0
    if not args.app:
        msg = "name an app spec file or a bundled app (see --list)"
        raise AppError(msg)
    text = _spec_text(args.app)
    res = run(call(args, "submit", {"spec": text, "set": list(args.set)}))
    app_id = res["app_id"]
    for warning in res.get("warnings") or ():
        print(f"Warning: {warning}", file=sys.stderr)
    if args.wait:
        status = run(_wait(args, call, app_id))
        if args.json:
            print(json.dumps(status))
        else:
            _print_status(status)
        return 0 if status["state"] == "finished" else 1
    print(json.dumps({"app_id": app_id}) if args.json else app_id)
    return 0


async def _wait(args: argparse.Namespace, call: Call, app_id: str) -> dict[str, Any]:
    import asyncio

    while True:
        status: dict[str, Any] = await call(args, "status", {"app_id": app_id})
        if status["state"] in TERMINAL:
            return status
        await asyncio.sleep(0.5)


def _days(text: str) -> int:
    days = _positive(text)
    if days > 366:
        msg = "at most 366 days"
        raise argparse.ArgumentTypeError(msg)
    return days


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        msg = f"{text!r} is not a positive whole number"
        raise argparse.ArgumentTypeError(msg)
    return n


def _apps(args: argparse.Namespace, call: Call, run: Callable[[Any], Any]) -> int:
    res = run(call(args, "apps", {"days": args.days, "limit": args.limit}))
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    if not res:
        print(f"no apps in the last {args.days} day(s)")
        return 0
    print(f"{'APP':32} {'STATE':10} {'SCHEDULER':16} SUBMITTED")
    for a in res:
        when = time.strftime("%H:%M:%S", time.localtime(a.get("submitted_at") or 0))
        print(f"{a['app_id']:32} {a['state']:10} {a.get('scheduler', '?'):16} {when}")
    return 0


def _status(args: argparse.Namespace, call: Call, run: Callable[[Any], Any]) -> int:
    res = run(call(args, "status", {"app_id": args.app_id}))
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        _print_status(res)
    return 0


def _stop(args: argparse.Namespace, call: Call, run: Callable[[Any], Any]) -> int:
    res = run(call(args, "stop", {"app_id": args.app_id}))
    if args.json:
        print(json.dumps({"app_id": res["app_id"], "state": res["state"]}))
    else:
        print(f"{res['app_id']}: {res['state']}")
    return 0


def _connection_text(info: dict[str, Any]) -> str:
    """``: retrying since 12:03:04: cannot connect ...`` for a connector with a broker."""
    state = info.get("connection")
    if state is None:
        return ""
    since = info.get("retrying_since")
    when = f" since {time.strftime('%H:%M:%S', time.localtime(since))}" if since else ""
    error = f": {info['last_error']}" if info.get("last_error") else ""
    return f" ({state}{when}{error})" if info.get("path") else f": {state}{when}{error}"


def _dead_letter_text(sink: dict[str, Any]) -> str:
    """``: /data/out/app/dead-letters/op-gw-1.jsonl, 3 lost (why)`` for a dead-letter
    file; ``: retrying since 12:03:04: why, 0 published, 7 queued`` for an mqtt one."""
    where = f": {sink['path']}" if sink.get("path") else ""
    counts = ""
    if "published" in sink:
        counts = f", {sink['published']} published, {sink.get('queued', 0)} queued"
    lost = f", {sink['lost']} lost" if sink.get("lost") else ""
    error = f" ({sink['error']})" if sink.get("error") else ""
    return where + _connection_text(sink) + counts + lost + error


def _buffer_text(info: dict[str, Any]) -> str:
    """``; 1200 rows wait on disk, 2 epochs dropped (buffer full)`` for an sql or
    http sink."""
    rows, lost = info.get("buffered_rows"), info.get("buffer_overflows")
    if not rows and not lost:
        return ""
    text = f"; {rows} rows wait on disk" if rows else ""
    return text + (f"; {lost} batches dropped (buffer full)" if lost else "")


def _print_status(s: dict[str, Any]) -> None:
    t = s.get("totals", {})
    print(
        f"{s['app_id']} ({s['name']}): {s['state']}"
        + (f" - {s['error']}" if s.get("error") else "")
    )
    print(f"  scheduler: {s.get('scheduler')}")
    for src, peer in s.get("sources", {}).items():
        info = ((s.get("peers") or {}).get(peer) or {}).get("sources", {}).get(src) or {}
        print(f"  source {src} @ {peer}" + _connection_text(info))
    for op, peers in s.get("placement", {}).items():
        print(f"  operator {op} @ {', '.join(peers)}")
    for sink, peer in s.get("sinks", {}).items():
        info = ((s.get("peers") or {}).get(peer) or {}).get("sinks", {}).get(sink) or {}
        print(
            f"  sink {sink} @ {peer}"
            + (f": {info['path']}" if info.get("path") else "")
            + _connection_text(info)
            + _buffer_text(info)
        )
    for path in s.get("paths", []):
        print(f"  path: {' -> '.join(path)}")
    for op, view in s.get("scaling", {}).items():
        for peer, here in view.get("peers", {}).items():
            last = here.get("last") or {}
            if last:
                print(
                    f"  scaling {op} @ {peer}: {here.get('instances')} instance(s), "
                    f"health {last.get('health')}, last decision {last.get('action')}"
                    + ("" if last.get("enabled") else " (scaling not enabled)")
                )
    for op, problem in (s.get("problems") or {}).items():
        letters = problem.get("dead_letters")
        print(
            f"  operator {op}: {problem.get('errors')} record(s) dropped by errors"
            + ("" if letters is None else f", {letters} sent to its dead-letter sink")
        )
        for e in problem.get("recent", []):
            where = f" on {e['peer']}" if e.get("peer") else ""
            record = f", e.g. record {e['record']}" if e.get("record") else ""
            print(f"    {e.get('count', 1)} x {e.get('type')}: {e.get('message')}{where}{record}")
        for peer, sink in (problem.get("dead_letter_sinks") or {}).items():
            print(f"    dead letters @ {peer}" + _dead_letter_text(sink))
    if s.get("checkpoints") or s.get("checkpoint_failures"):
        failed = s.get("checkpoint_failures", 0)
        print(
            f"  checkpoints: {s.get('checkpoints', 0)} committed"
            + (f", {failed} failed" if failed else "")
        )
    problem = s.get("checkpoint_error")
    if problem:
        print(
            f"  checkpoint {problem.get('epoch')} of {problem.get('instance')} failed: "
            f"{problem.get('error')}"
        )
    for event in s.get("recoveries", []):
        when = time.strftime("%H:%M:%S", time.localtime(event.get("at") or 0))
        ops = ", ".join(event.get("operators") or []) or "its part"
        what = (
            f"{event.get('dead')} restarted at {when} and kept {ops}"
            if event.get("restarted")
            else f"{event.get('dead')} died at {when}; {event.get('takeover')} took over {ops}"
        )
        origin = (
            f"from checkpoint epoch {event.get('epoch')}"
            if event.get("mode") == "checkpoint"
            else "from the sources' beginning"
        )
        took = event.get("seconds")
        print(
            f"  recovery: {what}, {origin}, " + ("in progress" if took is None else f"in {took} s")
        )
    for event in s.get("rescales", []):
        print(
            f"  {event.get('action')} of {', '.join(event.get('operators', []))} from "
            f"{event.get('from')} to {event.get('to') or '-'}"
            + (f" (refused: {event['refused']})" if event.get("refused") else "")
        )
    if t:
        lat = t.get("latency_p50_ms")
        print(
            f"  records: {t['source_records']} in, {t['sink_records']} out, "
            f"{t['delayed']} delayed, {t['shed']} shed, {t['late']} late, {t['errors']} errors, "
            f"{t.get('dropped', 0)} dropped"
            + (
                f"; latency p50 {lat} ms, p99 {t.get('latency_p99_ms')} ms"
                if lat is not None
                else ""
            )
        )
