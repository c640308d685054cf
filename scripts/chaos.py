#!/usr/bin/env python3
"""A fault-injection soak: real peers, several apps at once, a seeded schedule of faults.

    .venv/bin/python scripts/chaos.py --schedules 20            # seeds 1 .. 20
    .venv/bin/python scripts/chaos.py --seed 7                  # replay seed 7 alone
    .venv/bin/python scripts/chaos.py --schedules 5 --first-seed 100 --json

Each schedule is one seed. It starts :data:`PEERS` real ``agiledart peer`` processes on
loopback (:class:`~agiledart.cli.emulate.LocalCluster`; sometimes with a lossy emulated
network, ``--links``), submits two to four small finite apps of different shapes
(union, windowed join, two-stage windows, top-k, dedupe, keyed running count; each
checkpointed with erasure coding or restarted from scratch, one perhaps fed at 10x its
rate) through peers that may die, and meanwhile injects faults at seeded times on the
*unpinned* peers (``edge-*``: no source or sink lives there, operators and schedulers
do): SIGKILL of one or two peers at once, SIGSTOP/SIGCONT (a frozen peer), a kill
followed by a restart with the same state dir, and a partition (a group of peers that
neither sends nor receives for a few seconds: SIGSTOP of the group, as loopback has no
netem). At most :data:`MAX_DOWN` peers are down or frozen at any time, so erasure-coded
state (k = 2) can always be rebuilt.

When every app has ended (or the schedule's time is up), every sink file is compared
with the plain-Python reference (:func:`agiledart.local.reference.reference_outputs`).
An app is *exact*, an *explained failure* (it failed, naming a pinned source or sink
peer that died: the faults never pick such a peer, so this only happens when a peer
was taken down by another's death), or *unexplained* (wrong output, a failure no
fault explains, or an app that never ended). A peer process that exits without
having been killed is counted in ``peers_taken_down_by_other_death``. Known findings
are named where an unexplained outcome matches them.

The schedule is printed before it runs, so a failing seed replays with ``--seed N``
(the fault times are wall-clock offsets: a replay is the same schedule, not the same
interleaving). ``--json`` ends the output with one JSON object of counts. The soak is
bounded (``--time-limit``) and leaves no process behind.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from benchlib import free_port

from agiledart.app import AppSpec, parse_spec
from agiledart.emulation import LocalCluster, site_name
from agiledart.errors import AgiledartError
from agiledart.local.reference import canonical, reference_outputs

PEERS = 8  #: sensor-1, sensor-2, gateway-1, gateway-2 (pinned), edge-1 .. edge-4
PINNED = tuple(range(4))  #: sources and sinks live on these peers only
UNPINNED = tuple(range(4, PEERS))
MAX_DOWN = 2  #: unpinned peers down or frozen at once, at most
ERASURE = {"mode": "erasure", "interval_ms": 1000, "m": 2, "k": 2}
SHAPES = ("union", "join", "windows", "topk", "dedupe", "counts")
TERMINAL = ("finished", "failed", "stopped")
RUN_S = 60.0  #: seconds a schedule's apps may take after the last fault, at most

# Unexplained outcomes that match a finding already being fixed elsewhere: (text in the
# error or a log, the finding's name).
KNOWN = (
    ("deque index out of range", "finding 1 (IndexError in AppInstance._merge_batch)"),
    ("holders, got", "finding 4b (checkpoint m+k vs ring size)"),
    ("KeyError", "finding 6b (_restore_plan KeyError)"),
    ("lost its instance", "finding 6f (downstream peer restarting before declared dead)"),
)


# -- the schedule: a plain value made from the seed ---------------------------------------


@dataclass(frozen=True)
class Fault:
    at: float  #: seconds after the apps are submitted
    kind: str  #: kill, freeze, restart, partition
    peers: tuple[int, ...]
    hold: float = 0.0  #: seconds frozen, or down before the restart

    def describe(self) -> str:
        names = "+".join(site_name(i) for i in self.peers)
        extra = f" for {self.hold:.1f} s" if self.hold else ""
        return f"t={self.at:5.1f} s  {self.kind:9} {names}{extra}"


@dataclass(frozen=True)
class AppPlan:
    name: str
    shape: str
    checkpointed: bool
    burst: bool  #: its sources replay at 10x their rate
    via: int  #: the peer it is submitted through (its scheduler)
    pin: int | None  #: an unpinned peer its stateful operator prefers
    seed: int


@dataclass(frozen=True)
class Schedule:
    seed: int
    apps: tuple[AppPlan, ...]
    faults: tuple[Fault, ...]
    lossy: dict[str, float] | None  #: "a|b" -> theta, or None: no emulated network

    def lines(self) -> list[str]:
        out = [f"schedule {self.seed}: {PEERS} peers" + (", lossy links" if self.lossy else "")]
        for a in self.apps:
            out.append(
                f"  app {a.name}: {a.shape}, "
                + ("erasure checkpoints" if a.checkpointed else "restart")
                + (", 10x burst" if a.burst else "")
                + f", via {site_name(a.via)}"
                + (f", stateful operator on {site_name(a.pin)}" if a.pin is not None else "")
            )
        out += [f"  fault {f.describe()}" for f in self.faults]
        return out


def make_schedule(seed: int) -> Schedule:
    rng = random.Random(seed)
    shapes = rng.sample(SHAPES, rng.randint(2, 3))
    apps = tuple(
        AppPlan(
            name=f"{shape}-{seed}",
            shape=shape,
            checkpointed=rng.random() < 0.5,
            burst=rng.random() < 0.2,
            via=rng.choice(UNPINNED),
            pin=rng.choice(UNPINNED) if rng.random() < 0.6 else None,
            seed=rng.randrange(1000),
        )
        for shape in shapes
    )
    faults: list[Fault] = []
    busy: list[tuple[float, float, int]] = []  # (from, to, peer): down or frozen
    for _ in range(rng.randint(1, 3)):
        kind = rng.choice(("kill", "kill", "freeze", "restart", "partition"))
        at = round(rng.uniform(1.0, 8.0), 1)
        hold = round(rng.uniform(1.0, 6.0), 1) if kind != "kill" else 0.0
        until = at + hold if kind != "kill" else 1e9
        width = 2 if kind == "partition" or (kind == "kill" and rng.random() < 0.3) else 1
        free = [p for p in UNPINNED if not any(p == q and a < until and at < b for a, b, q in busy)]
        overlapping = {q for a, b, q in busy if a < until and at < b}
        room = MAX_DOWN - len(overlapping)
        if room < 1 or not free:
            continue
        hot = [p for p in free if p in {a.via for a in apps} | {a.pin for a in apps}]
        pool = hot if hot and rng.random() < 0.7 else free  # mostly where apps run
        peers = tuple(sorted(rng.sample(pool, min(width, room, len(pool)))))
        faults.append(Fault(at, kind, peers, hold))
        busy += [(at, until, p) for p in peers]
    lossy = None
    if rng.random() < 0.3:
        names = [site_name(i) for i in range(PEERS)]
        lossy = {
            f"{a}|{b}": round(rng.uniform(0.6, 1.0), 2)
            for i, a in enumerate(names)
            for b in names[i + 1 :]
        }
    return Schedule(seed, apps, tuple(sorted(faults, key=lambda f: f.at)), lossy)


# -- the apps: small finite specs, each with an exact reference ---------------------------


def _source(sid: str, peer: str, dataset: str, seed: int, burst: bool, **extra: Any) -> Any:
    count, rate = 2_400, 300
    params: dict[str, Any] = {"dataset": dataset, "rate": rate, "count": count, "seed": seed}
    if burst:
        params |= {"count": count * 2, "speedup": 10}
    return {"id": sid, "peer": peer, "connector": "generator", "params": params | extra}


def _sink(sid: str, peer: str, path: str, inputs: list[str]) -> Any:
    return {
        "id": sid,
        "peer": peer,
        "connector": "file",
        "params": {"path": path},
        "inputs": inputs,
    }


def app_spec(plan: AppPlan) -> dict[str, Any]:
    """The raw spec of an app of ``plan.shape``."""
    s, b, n = plan.seed, plan.burst, plan.name
    if plan.shape == "union":
        sources = [
            _source("north", "sensor-1", "urban", s, b),
            _source("south", "sensor-2", "urban", s + 1, b),
        ]
        ops = [
            {"id": "both", "op": "union", "inputs": ["north", "south"]},
            {
                "id": "per-city",
                "op": "window",
                "params": {"size_ms": 1000, "key": "city", "aggregate": "count"},
                "inputs": ["both"],
            },
        ]
        sinks = [_sink("out", "gateway-1", f"{n}.jsonl", ["per-city", "both"])]
    elif plan.shape == "join":
        sources = [
            _source("north", "sensor-1", "urban", s, b),
            _source("south", "sensor-2", "urban", s + 1, b),
        ]
        temp = {"field": "metric", "value": "temperature"}
        ops = [
            {
                "id": "nt",
                "op": "filter",
                "fn": "builtin:equals",
                "params": temp,
                "inputs": ["north"],
            },
            {
                "id": "st",
                "op": "filter",
                "fn": "builtin:equals",
                "params": temp,
                "inputs": ["south"],
            },
            {
                "id": "pairs",
                "op": "join",
                "params": {"key": "sensor", "window_ms": 1000},
                "inputs": ["nt", "st"],
            },
        ]
        sinks = [_sink("out", "gateway-2", f"{n}.jsonl", ["pairs"])]
    elif plan.shape == "windows":
        sources = [_source("readings", "sensor-1", "counter", s, b, keys=8)]
        ops = [
            {
                "id": "per-second",
                "op": "window",
                "params": {"size_ms": 1000, "key": "key", "aggregate": "count"},
                "inputs": ["readings"],
            },
            {
                "id": "per-5s",
                "op": "window",
                "params": {"size_ms": 5000, "key": "key", "aggregate": "sum", "field": "value"},
                "inputs": ["per-second"],
            },
        ]
        sinks = [_sink("out", "gateway-1", f"{n}.jsonl", ["per-5s"])]
    elif plan.shape == "topk":
        sources = [_source("readings", "sensor-2", "urban", s, b)]
        ops = [
            {
                "id": "per-city",
                "op": "window",
                "params": {"size_ms": 1000, "key": "city", "aggregate": "count"},
                "inputs": ["readings"],
            },
            {
                "id": "busiest",
                "op": "top_k",
                "params": {"k": 3, "by": "value", "window_ms": 2000},
                "inputs": ["per-city"],
            },
        ]
        sinks = [_sink("out", "gateway-2", f"{n}.jsonl", ["busiest"])]
    elif plan.shape == "dedupe":
        sources = [_source("raw", "sensor-1", "urban", s, b, dup_ratio=0.1)]
        ops = [
            {
                "id": "unique",
                "op": "dedupe",
                "params": {"key": "id", "ttl_ms": 3000},
                "inputs": ["raw"],
            }
        ]
        sinks = [_sink("out", "gateway-1", f"{n}.jsonl", ["unique"])]
    else:  # counts
        sources = [_source("readings", "sensor-2", "counter", s, b, keys=16)]
        ops = [
            {
                "id": "counts",
                "op": "aggregate",
                "params": {"key": "key", "aggregate": "count"},
                "inputs": ["readings"],
            }
        ]
        sinks = [_sink("out", "gateway-2", f"{n}.jsonl", ["counts"])]
    if plan.pin is not None:
        ops[-1]["peer"] = site_name(plan.pin)
    checkpoint = dict(ERASURE) if plan.checkpointed else {"mode": "restart"}
    return {
        "name": n,
        "checkpoint": checkpoint,
        "sources": sources,
        "operators": ops,
        "sinks": sinks,
    }


def links_file(lossy: dict[str, float], path: Path) -> Path:
    names = [site_name(i) for i in range(PEERS)]
    links = [
        {"from": k.split("|")[0], "to": k.split("|")[1], "theta": theta}
        for k, theta in lossy.items()
    ]
    graph = {
        "format": "agiledart-bandit-graph",
        "version": 1,
        "name": "chaos",
        "slot_ms": 2.0,
        "undirected": True,
        "source": names[0],
        "sink": names[-1],
        "nodes": names,
        "links": links,
    }
    path.write_text(json.dumps(graph))
    return path


# -- judging an app's end -------------------------------------------------------------------


@dataclass
class Outcome:
    app: str
    verdict: str  #: exact, explained, unexplained
    reason: str = ""
    known: str = ""  #: the known finding an unexplained outcome matches


def judge(
    spec: AppSpec,
    status: dict[str, Any] | None,
    dead_pinned: set[str],
    logs: str,
    hint: str = "",
) -> Outcome:
    """The verdict on one app from its last ``status`` (None: never answered); ``hint``
    says what the driver saw of an app that did not end."""
    if status is None or status.get("state") not in TERMINAL:
        state = "no status" if status is None else status.get("state")
        return _unexplained(spec.name, f"did not end (last state: {state}){hint}", logs)
    if status["state"] != "finished":
        error = str(status.get("error") or "")
        if any(p in error for p in dead_pinned) and "source or sink" in error:
            return Outcome(spec.name, "explained", error)
        return _unexplained(spec.name, f"{status['state']}: {error}", logs)
    expected = reference_outputs(spec)
    paths: dict[str, str] = {}
    for peer_stats in status.get("peers", {}).values():
        if isinstance(peer_stats, dict):
            for sink, info in peer_stats.get("sinks", {}).items():
                paths[sink] = info.get("path")
    for sink in spec.sinks:
        want = _normalise(expected[sink.id])
        path = paths.get(sink.id)
        if path is None:
            return _unexplained(spec.name, f"sink {sink.id}: no output file in status", logs)
        try:
            text = Path(path).read_text()
            got = [json.loads(line) for line in text.splitlines() if line.strip()]
        except (OSError, ValueError) as exc:
            return _unexplained(spec.name, f"sink {sink.id}: unreadable output: {exc}", logs)
        if canonical(got) != canonical(want):
            missing = len(_minus(want, got))
            extra = len(_minus(got, want))
            reason = (
                f"sink {sink.id}: inexact output: {len(got)} records, expected {len(want)} "
                f"({missing} missing, {extra} not expected)"
            )
            return _unexplained(spec.name, reason, logs)
    return Outcome(spec.name, "exact")


def _unexplained(app: str, reason: str, logs: str) -> Outcome:
    known = next((name for text, name in KNOWN if text in reason), "")
    if not known and "did not end" not in reason:
        known = next((name for text, name in KNOWN if text in logs and app in logs), "")
    return Outcome(app, "unexplained", reason, known)


def _normalise(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [json.loads(json.dumps(r, sort_keys=True)) for r in records]


def _minus(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> list[str]:
    left: dict[str, int] = {}
    for r in b:
        k = json.dumps(r, sort_keys=True)
        left[k] = left.get(k, 0) + 1
    out = []
    for r in a:
        k = json.dumps(r, sort_keys=True)
        if left.get(k, 0):
            left[k] -= 1
        else:
            out.append(k)
    return out


# -- the driver -----------------------------------------------------------------------------


@dataclass
class Result:
    seed: int
    outcomes: list[Outcome] = field(default_factory=list)
    taken_down: list[str] = field(default_factory=list)  #: peers that died unkilled
    wall_s: float = 0.0


class Soak:
    """Runs one schedule on a fresh cluster in ``root``; every process is reaped."""

    def __init__(self, schedule: Schedule, root: Path, say: Callable[[str], None]) -> None:
        self.schedule = schedule
        self.root = root
        self.say = say
        self.killed: set[int] = set()  #: peers whose current process we killed
        self.frozen: set[int] = set()
        self.t0 = 0.0

    def run(self) -> Result:
        result = Result(self.schedule.seed)
        start = time.monotonic()
        extra = ["--workers", "0"]
        if self.schedule.lossy is not None:
            extra += ["--links", str(links_file(self.schedule.lossy, self.root / "links.json"))]
        port = free_port()
        cluster = LocalCluster(PEERS, port=port, workdir=self.root, extra_args=extra)
        with cluster:
            try:
                asyncio.run(self._drive(cluster, result))
            finally:
                self._thaw(cluster)
            result.taken_down = self._taken_down(cluster)
        result.wall_s = time.monotonic() - start
        return result

    async def _drive(self, cluster: LocalCluster, result: Result) -> None:
        await cluster.wait_formed(timeout=90)
        specs: dict[str, AppSpec] = {}
        ids: dict[str, str] = {}
        for plan in self.schedule.apps:
            raw = app_spec(plan)
            specs[plan.name] = parse_spec(raw)
            reply = await self._request(
                cluster, plan.via, "submit", {"spec": yaml.safe_dump(raw), "set": []}, 20.0
            )
            ids[plan.name] = str(reply["app_id"])
        self.t0 = time.monotonic()
        self.say(f"  submitted {', '.join(ids.values())}")
        faults = asyncio.gather(*(self._fault(cluster, f) for f in self.schedule.faults))
        last = max((f.at + f.hold for f in self.schedule.faults), default=0.0)
        statuses: dict[str, dict[str, Any] | None] = dict.fromkeys(ids)
        deadline = self.t0 + last + RUN_S
        shown = ""
        while time.monotonic() < deadline:
            await asyncio.sleep(1.0)
            for name, app_id in ids.items():
                s = statuses[name]
                if s is not None and s.get("state") in TERMINAL:
                    continue
                statuses[name] = await self._status(cluster, app_id) or statuses[name]
            line = "  ".join(
                f"{n.rsplit('-', 1)[0]}={(s or {}).get('state', '?')}" for n, s in statuses.items()
            )
            if line != shown:
                self.say(f"  t={time.monotonic() - self.t0:5.1f} s  {line}")
                shown = line
            if all(s is not None and s.get("state") in TERMINAL for s in statuses.values()):
                break
        await faults
        dead_pinned = {cluster.name(i) for i in PINNED if cluster.procs[i].poll() is not None}
        logs = self._logs(cluster)
        (self.root / "statuses.json").write_text(json.dumps(statuses, indent=1, default=str))
        for name in ids:
            hint = await self._hint(cluster, ids[name], statuses[name])
            outcome = judge(specs[name], statuses[name], dead_pinned, logs, hint)
            result.outcomes.append(outcome)
            note = f" ({outcome.reason})" if outcome.reason else ""
            known = f" [{outcome.known}]" if outcome.known else ""
            self.say(f"  {name}: {outcome.verdict}{note}{known}")

    async def _fault(self, cluster: LocalCluster, fault: Fault) -> None:
        await asyncio.sleep(max(0.0, self.t0 + fault.at - time.monotonic()))
        self.say(f"  fault {fault.describe()}")
        if fault.kind == "kill":
            for i in fault.peers:
                self._kill(cluster, i)
        elif fault.kind in ("freeze", "partition"):
            for i in fault.peers:
                self._signal(cluster, i, signal.SIGSTOP)
                self.frozen.add(i)
            await asyncio.sleep(fault.hold)
            for i in fault.peers:
                self._signal(cluster, i, signal.SIGCONT)
                self.frozen.discard(i)
        elif fault.kind == "restart":
            for i in fault.peers:
                self._kill(cluster, i)
            await asyncio.sleep(fault.hold)
            for i in fault.peers:
                cluster.procs[i] = cluster.start(i)
                self.killed.discard(i)

    async def _hint(self, cluster: LocalCluster, app_id: str, status: dict[str, Any] | None) -> str:
        """For an app that did not end: its hosts that answer but run none of it."""
        if status is None or status.get("state") in TERMINAL:
            return ""
        hosts = set(status.get("sources", {}).values()) | set(status.get("sinks", {}).values())
        hosts |= {p for peers in status.get("placement", {}).values() for p in peers}
        lost = []
        for i in range(cluster.peers):
            if cluster.name(i) not in hosts or i in self.frozen:
                continue
            ring = await cluster.ring(i)
            if ring is not None and app_id not in ring.get("apps", ()):
                lost.append(cluster.name(i))
        return f"; {', '.join(lost)} lost its instance" if lost else ""

    def _kill(self, cluster: LocalCluster, i: int) -> None:
        if cluster.procs[i].poll() is None:
            self.killed.add(i)  # before the signal: its exit is ours
            cluster.kill(i)

    def _signal(self, cluster: LocalCluster, i: int, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            cluster.procs[i].send_signal(sig)

    def _thaw(self, cluster: LocalCluster) -> None:
        for i in list(self.frozen):
            self._signal(cluster, i, signal.SIGCONT)
        self.frozen.clear()

    def _taken_down(self, cluster: LocalCluster) -> list[str]:
        out = []
        for i, proc in enumerate(cluster.procs):
            if proc.poll() is not None and i not in self.killed:
                out.append(f"{cluster.name(i)} (exit {proc.returncode}): {self._last(i)}")
        return out

    def _last(self, i: int) -> str:
        path = self.root / f"{site_name(i)}.log"
        with contextlib.suppress(OSError):
            lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
            return lines[-1] if lines else ""
        return ""

    def _logs(self, cluster: LocalCluster) -> str:
        out = []
        for i in range(cluster.peers):
            with contextlib.suppress(OSError):
                out.append((self.root / f"{cluster.name(i)}.log").read_text(errors="replace"))
        return "\n".join(out)

    async def _request(
        self, cluster: LocalCluster, i: int, rpc: str, body: dict[str, Any], timeout: float
    ) -> Any:
        try:
            return await cluster.request(i, rpc, body, timeout=timeout)
        except (AgiledartError, OSError) as exc:
            msg = f"{rpc} through {cluster.name(i)} failed: {exc}"
            raise AgiledartError(msg) from exc

    async def _status(self, cluster: LocalCluster, app_id: str) -> dict[str, Any] | None:
        """The app's status asked through a pinned peer (never faulted); None: no answer."""
        for i in PINNED:
            try:
                s: dict[str, Any] = await cluster.request(
                    i, "status", {"app_id": app_id}, timeout=5.0
                )
            except (AgiledartError, OSError):
                continue
            return s
        return None


def code_version() -> str:
    """The commit the peers run (``+`` when the tree has changes), for the record."""
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+" if dirty else "")


def run_schedule(seed: int, root: Path, say: Callable[[str], None]) -> Result:
    """Make, print and run schedule ``seed`` in a fresh folder under ``root``."""
    schedule = make_schedule(seed)
    for line in schedule.lines():
        say(line)
    say(f"  code {code_version()}")
    folder = root / f"seed-{seed}"
    folder.mkdir(parents=True, exist_ok=True)
    try:
        return Soak(schedule, folder, say).run()
    except AgiledartError as exc:  # the cluster never formed, or a submit failed
        say(f"  schedule {seed} could not run: {exc}")
        return Result(seed, [Outcome(f"seed-{seed}", "unexplained", str(exc))])


def totals(results: list[Result]) -> dict[str, Any]:
    outcomes = [o for r in results for o in r.outcomes]
    return {
        "schedules": len(results),
        "apps": len(outcomes),
        "exact": sum(o.verdict == "exact" for o in outcomes),
        "explained_failures": sum(o.verdict == "explained" for o in outcomes),
        "unexplained": sum(o.verdict == "unexplained" for o in outcomes),
        "peers_taken_down_by_other_death": sum(len(r.taken_down) for r in results),
        "seeds": [r.seed for r in results],
        "failing_seeds": sorted(
            {
                r.seed
                for r in results
                if r.taken_down or any(o.verdict == "unexplained" for o in r.outcomes)
            }
        ),
        "failures": [
            {"seed": r.seed, "app": o.app, "reason": o.reason, "known": o.known}
            for r in results
            for o in r.outcomes
            if o.verdict == "unexplained"
        ]
        + [{"seed": r.seed, "peer_down": p} for r in results for p in r.taken_down],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, help="run this one schedule (replay a failing seed)")
    p.add_argument("--schedules", type=int, default=1, help="schedules to run (default 1)")
    p.add_argument("--first-seed", type=int, default=1, help="seed of the first (default 1)")
    p.add_argument(
        "--time-limit",
        type=float,
        default=3600.0,
        help="start no schedule after this many seconds (default 3600)",
    )
    p.add_argument("--workdir", type=Path, help="keep each schedule's logs and outputs here")
    p.add_argument("--json", action="store_true", help="end with one JSON object of counts")
    args = p.parse_args(argv)
    seeds = (
        [args.seed]
        if args.seed is not None
        else [args.first_seed + i for i in range(args.schedules)]
    )

    def say(line: str) -> None:
        print(line, file=sys.stderr if args.json else sys.stdout, flush=True)

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # unwinds through every cluster's teardown

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    start = time.monotonic()
    results: list[Result] = []
    with contextlib.ExitStack() as stack:
        root = args.workdir or Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix="chaos-"))
        )
        for n, seed in enumerate(seeds, 1):
            if time.monotonic() - start > args.time_limit:
                say(f"time limit reached after {n - 1} schedules")
                break
            try:
                result = run_schedule(seed, root, say)
            except (KeyboardInterrupt, asyncio.CancelledError):
                say(f"interrupted during schedule {seed} (not counted)")
                break
            results.append(result)
            for peer in result.taken_down:
                say(f"  peer taken down: {peer}")
            t = totals(results)
            say(
                f"[{n}/{len(seeds)}] seed {seed} in {result.wall_s:.0f} s; so far: "
                f"{t['exact']} exact, {t['explained_failures']} explained, "
                f"{t['unexplained']} unexplained, {t['peers_taken_down_by_other_death']} "
                "peers taken down"
            )
    t = totals(results)
    if args.json:
        print(json.dumps(t))
    else:
        print(json.dumps({k: v for k, v in t.items() if k != "failures"}))
    return 0 if not t["failing_seeds"] else 1


if __name__ == "__main__":
    sys.exit(main())
