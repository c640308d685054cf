"""A worker process: runs turns of operator instances for its peer.

Started by the peer (``python -m agiledart.runtime.execution.worker --fd N``) with one
end of a socketpair; it answers every request, in order, with ``("ok", value, stats,
seconds)`` or ``("err", message)``, and exits when the peer closes the stream.

Requests (tuples; see :mod:`agiledart.runtime.execution.host`):

* ``("app", app_id, spec, units, code_ids, cache_dir)``: the app's spec (``to_dict``),
  its units (unit id -> operator ids) and the registered code it needs, which the peer
  has already fetched into ``cache_dir``;
* ``("feed", app_id, unit, producer, records, state)`` and
  ``("wm", app_id, unit, producer, watermark, state)``: one turn; ``state`` (operator
  snapshots) comes when the unit's state moves here from another worker;
* ``("export", app_id, unit)``: hand the unit's state over (and forget the unit);
* ``("unit", app_id, unit, ops)``: a unit added to a running app (elastic scaling: a
  new instance), or with ``ops`` None removed from it;
* ``("drop", app_id)``: forget the app.

``stats`` are the unit's operator counters since the last turn (the peer adds them
up: a stateless unit may run on any worker), ``seconds`` the turn's execution time.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agiledart.app.parse import parse_spec
from agiledart.app.spec import AppSpec
from agiledart.local.executor import Executor
from agiledart.operators.base import OperatorStats
from agiledart.runtime.execution.wire import WorkerGone, pack, recv_frame

log = logging.getLogger("agiledart.worker")


@dataclass
class _App:
    spec: AppSpec
    units: dict[int, list[str]]
    resolve: Any
    executors: dict[int, Executor] = field(default_factory=dict)

    def executor(self, unit: int, state: dict[str, bytes] | None) -> Executor:
        ex = self.executors.get(unit)
        if ex is None or state is not None:
            ex = Executor(self.spec, self.resolve, operators=self.units[unit], states=state)
            self.executors[unit] = ex
        return ex


class Worker:
    def __init__(self) -> None:
        self.apps: dict[str, _App] = {}

    def handle(self, req: tuple[Any, ...]) -> tuple[Any, ...]:
        kind = req[0]
        if kind in ("feed", "wm"):
            _, app_id, unit, producer, what, state = req
            app = self.apps[app_id]
            ex = app.executor(unit, state)
            start = time.perf_counter()
            out = ex.feed(producer, what) if kind == "feed" else ex.watermark(producer, what)
            took = time.perf_counter() - start
            return ("ok", out, _take_stats(ex), took)
        if kind == "export":
            _, app_id, unit = req
            gone = self.apps[app_id].executors.pop(unit, None)
            return ("ok", None if gone is None else gone.snapshot(), {}, 0.0)
        if kind == "app":
            _, app_id, spec, units, code_ids, cache_dir = req
            if app_id not in self.apps:  # defined once: its executors hold state
                resolve = _resolver(cache_dir, code_ids)
                app = self.apps[app_id] = _App(parse_spec(spec), dict(units), resolve)
                for uid in app.units:  # user factories run now, before the data comes
                    app.executor(uid, None)
            return ("ok", None, {}, 0.0)
        if kind == "unit":
            _, app_id, unit, ops = req
            known = self.apps.get(app_id)
            if known is not None:
                known.executors.pop(unit, None)
                if ops is None:
                    known.units.pop(unit, None)
                else:
                    known.units[unit] = list(ops)
                    known.executor(unit, None)
            return ("ok", None, {}, 0.0)
        if kind == "drop":
            self.apps.pop(req[1], None)
            return ("ok", None, {}, 0.0)
        if kind == "ping":
            return ("ok", os.getpid(), {}, 0.0)
        return ("err", f"unknown request {kind!r}")


def _take_stats(ex: Executor) -> dict[str, dict[str, Any]]:
    """The executor's operator counters since the last call (then zeroed)."""
    out = {}
    for name, op in ex.operators.items():
        out[name] = op.stats.as_dict()
        op.stats = OperatorStats()
    return out


def _resolver(cache_dir: str, code_ids: list[str]) -> Any:
    from agiledart.runtime.code import CodeStore

    store = CodeStore(None, Path(cache_dir))
    store.load_cached(code_ids)
    return store.resolver()


def serve(sock: socket.socket) -> None:
    worker = Worker()
    while True:
        try:
            req = recv_frame(sock)
        except (WorkerGone, OSError):
            return
        try:
            reply = worker.handle(req)
        except (Exception, SystemExit) as exc:  # user code, a bad request: the turn fails
            reply = ("err", f"{type(exc).__name__}: {exc}")
        try:
            frame = pack(reply)
        except Exception as exc:  # an unpicklable result
            frame = pack(("err", f"cannot send the result: {type(exc).__name__}: {exc}"))
        try:
            sock.sendall(frame)
        except OSError:  # the peer went away: so do we
            return


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="agiledart-worker", description=__doc__)
    parser.add_argument("--fd", type=int, required=True, help="the socket to the peer")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the peer decides when workers stop
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    sock = socket.socket(fileno=args.fd)
    try:
        serve(sock)
    finally:
        sock.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
