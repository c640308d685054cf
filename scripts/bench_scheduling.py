"""Operator scheduling on one edge peer (issue 5): EdgeWise, random, OS and Lachesis.

What is measured (EdgeWise §7.2-7.3, Lachesis §6.2): per scheduler, the highest input
rate one peer on 2 cores sustains at low latency on two RIoTBench-like topologies with
skewed operator costs, and how evenly the scheduler loads the operators.

* Workload: ``scripts/riot/stats.yaml`` (SenML parse -> block average, Kalman filter ->
  sliding linear regression, distinct count -> sink; ~4 outputs per input) and
  ``scripts/riot/pred.yaml`` (parse -> decision tree, linear-regression prediction,
  block average -> error estimate -> SenML publish -> sink; ~2 outputs per input), with
  the functions of ``scripts/riot/ops.py``. Every operator does its small real work
  plus a calibrated busy loop per record: ``--heavy-us`` for the two heavy ones of each
  topology, ``--light-us`` for the others, about 10x apart all told (``op_cost_us``:
  CPU us per record of each operator, measured in this process before the run;
  ``service_us``: the same as the peer measured it at the reported rate, its per-record
  overhead included). Input: the built-in ``urban`` generator, timer-driven at the rate
  under test (as EdgeWise's replayed trace); a ``discard`` sink on the same peer.
* Peer: per scheduler S, one ``agiledart peer --insecure --name bench --workers 2
  --scheduler S --offload-us 0`` (``lachesis`` with ``--lachesis-policy``; ``--turn``;
  ``--offload-us 0`` puts every operator under the scheduler, none in the peer's own
  loop, as the bench's ``--offload-us`` may change) pinned to 2
  CPUs with ``sched_setaffinity``, which its worker processes inherit (``peer_cpus``:
  the CPUs its whole process tree was seen allowed on). ``inline`` is ``--workers 0``,
  the operators in the peer's own event loop (chained: one meter for all, so its
  utilization CV is 0). The functions are registered on the peer (the ``register`` RPC,
  what ``agiledart register scripts/riot/ops.py --via HOST:PORT`` sends), one unjudged
  warm-up app starts the workers, then each rate step is one finite app submitted with
  ``--set params.rate=R params.count=rate*duration params.code=ID``. If ``submit``
  cannot place it on a one-peer ring (placement put at most 4 operators on a peer
  before the scheduler learnt to raise that limit), the same spec is deployed with
  every node on the peer by the ``deploy`` and ``start`` RPCs, as ``bench_pipeline.py``
  does; ``deploy`` in the report says which way ran.
* A rate is sustained when the app finishes with every record through (the source
  emitted them all, no operator or sink errors, nothing dropped), the sink's end-to-end
  p99 latency (5% of records traced, source wall clock to sink, the sink's last 4096
  samples) is <= 100 ms, and at most ``--max-delayed-pct`` of the records left the
  source more than 100 ms behind its schedule (``delayed``, ``shed``): such a record
  waited in front of the source, where no trace sees it. A step is cut short as soon as
  more fall behind. The sweep doubles the rate from ``--start-rate`` until a step fails
  (halves it while the first rates fail), then bisects (geometric mean) ``--bisect``
  times; the best sustained rate is reported, with a ``note`` when it is only a lower
  bound (no step failed) or why there is none.
* ``utilization_cv``: the coefficient of variation (stddev / mean) over the operators of
  their utilization rho_w = 1 - T_emptyQ / T_w (EdgeWise eq. 11: the peer's
  per-operator meter, a 10 s window), averaged over the polls (every 0.5 s) made
  while the source was between 50% and 95% of its records, at the reported rate.
  Lower is more balanced.
* Ratios ``edgewise_vs_os``, ``edgewise_vs_random``, ``lachesis_vs_os`` and
  ``lachesis_vs_edgewise`` of sustained rates (null unless both sweeps found a failing
  rate above the sustained one: a lower bound makes no ratio), each beside its anchor
  from the papers (not re-measured; ``anchor_source`` cites them): EdgeWise 3x over
  Storm (OWPOA: the OS schedules a thread per operator) on STATS and +57% (2800 ->
  4400/s) on PRED at <= 100 ms; Lachesis 340 vs 330/s for OS and EdgeWise on STATS,
  and +18% over OS, +8% over EdgeWise on ETL (the anchor for PRED, which Lachesis did
  not run).

An engine whose ``agiledart peer --help`` has no ``--scheduler`` gets only ``inline``,
said loudly on stderr; the four schedulers are null with that reason and the JSON keys
stay the same. A peer that dies or stops answering ends its scheduler's sweeps: the
steps measured before stay, and the ``note`` quotes the error and the peer's log.
``cpu_steal_pct`` is the share of CPU time the hypervisor took during the run. As
every benchmark: runnable on 2 cores, progress on stderr, one JSON object on the last
line with ``--json``. The default run takes about 10 minutes on 2 cores.

    python scripts/bench_scheduling.py [--json] [--quick] [--schedulers edgewise,os]
        [--topologies stats,pred] [--duration S] [--lachesis-policy qs|fcfs|hr]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import importlib.util
import json
import math
import os
import platform
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchlib import cpu_steal, free_port, steal_pct

SCHEDULERS = ("edgewise", "random", "os", "lachesis")
INLINE = "inline"  #: --workers 0: operators in the peer's own event loop
ALL_SCHEDULERS = (*SCHEDULERS, INLINE)
TOPOLOGIES = ("stats", "pred")
RIOT = Path(__file__).resolve().parent / "riot"
PEER_NAME = "bench"
LATENCY_BUDGET_MS = 100.0
TERMINAL = ("finished", "failed", "stopped")
#: (ratio, numerator, denominator)
RATIOS = (
    ("edgewise_vs_os", "edgewise", "os"),
    ("edgewise_vs_random", "edgewise", "random"),
    ("lachesis_vs_os", "lachesis", "os"),
    ("lachesis_vs_edgewise", "lachesis", "edgewise"),
)
ANCHORS: dict[str, dict[str, Any]] = {
    "stats": {
        "edgewise_vs_os": 3.0,
        "edgewise_vs_random": None,
        "lachesis_vs_os": round(340 / 330, 2),
        "lachesis_vs_edgewise": round(340 / 330, 2),
        "source": "EdgeWise §7.2 (STATS, <= 100 ms: 3x over Storm); Lachesis §6.2 "
        "(STATS on Storm: 340 vs 330/s for OS and EdgeWise); EdgeWise reports no "
        "figure for WP+Random",
    },
    "pred": {
        "edgewise_vs_os": round(4400 / 2800, 2),
        "edgewise_vs_random": None,
        "lachesis_vs_os": round(1625 / 1375, 2),
        "lachesis_vs_edgewise": round(1625 / 1500, 2),
        "source": "EdgeWise §7.2 (PRED, <= 100 ms: 2800 -> 4400/s over Storm); Lachesis "
        "§6.2 on ETL (1625 vs 1375/s for OS, 1500/s for EdgeWise; Lachesis did not run "
        "PRED); EdgeWise reports no figure for WP+Random",
    },
}


def log(msg: str) -> None:
    print(f"[bench_scheduling] {msg}", file=sys.stderr, flush=True)


# -- the peer ---------------------------------------------------------------------------


def peer_cli() -> list[str]:
    return [sys.executable, "-m", "agiledart.cli", "--log-level", "warning"]


@dataclass(frozen=True)
class PeerFlags:
    """What this engine's ``agiledart peer`` accepts, from its ``--help``."""

    scheduler: bool
    choices: frozenset[str] | None  #: the --scheduler choices, when the help lists them
    lachesis_policy: bool
    turn: bool
    offload: bool = False

    def refuses(self, scheduler: str) -> str | None:
        """Why a peer cannot run ``scheduler``; None when it can."""
        if scheduler == INLINE:
            return None
        if not self.scheduler:
            return "agiledart peer has no --scheduler flag yet (ran 'inline' instead)"
        if self.choices is not None and scheduler not in self.choices:
            return f"agiledart peer --scheduler offers {sorted(self.choices)}, not {scheduler!r}"
        return None


def peer_flags() -> PeerFlags:
    proc = subprocess.run(
        [*peer_cli(), "peer", "--help"], capture_output=True, text=True, check=True, timeout=60
    )
    text = " ".join(proc.stdout.split())
    choices = re.search(r"--scheduler \{([^}]*)\}", text)
    return PeerFlags(
        scheduler="--scheduler" in text,
        choices=frozenset(choices.group(1).split(",")) if choices else None,
        lachesis_policy="--lachesis-policy" in text,
        turn="--turn" in text,
        offload="--offload-us" in text,
    )


def peer_args(scheduler: str, args: argparse.Namespace, flags: PeerFlags, port: int) -> list[str]:
    """``agiledart peer`` arguments for ``scheduler`` (the state dir as ``DIR``)."""
    workers = 0 if scheduler == INLINE else len(args.cpus)
    out = ["peer", "--listen", f"127.0.0.1:{port}", "--insecure", "--state-dir", "DIR"]
    out += ["--name", PEER_NAME, "--workers", str(workers)]
    if scheduler != INLINE:
        out += ["--scheduler", scheduler]
        if scheduler == "lachesis" and flags.lachesis_policy:
            out += ["--lachesis-policy", args.lachesis_policy]
        if flags.turn and args.turn:
            out += ["--turn", str(args.turn)]
        if flags.offload:
            out += ["--offload-us", f"{args.offload_us:g}"]
    return out


class PeerFailed(RuntimeError):
    """The peer process exited or never answered."""


@dataclass(frozen=True)
class PeerProcess:
    proc: subprocess.Popen[bytes]
    log_path: Path

    def log_tail(self, lines: int = 5) -> str:
        text = self.log_path.read_text(errors="replace").strip().splitlines()
        return " | ".join(text[-lines:]) or "(empty)"


@contextlib.contextmanager
def running_peer(argv: list[str], cpus: list[int]) -> Iterator[PeerProcess]:
    """The peer process, pinned to ``cpus``, stopped (SIGTERM, then its whole process
    group killed) on exit. ``argv``'s ``DIR`` is replaced by a fresh state dir."""
    with tempfile.TemporaryDirectory(prefix="bench-scheduling-") as tmp:
        cmd = [*peer_cli(), *(a if a != "DIR" else str(Path(tmp) / "state") for a in argv)]
        log_path = Path(tmp) / "peer.log"
        with log_path.open("wb") as out:
            proc = subprocess.Popen(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=lambda: os.sched_setaffinity(0, cpus),  # before any thread
            )
        try:
            yield PeerProcess(proc, log_path)
        finally:
            _stop(proc)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(5)
            return
        except subprocess.TimeoutExpired:
            log(f"peer {proc.pid} ignored SIGTERM; killing its process group")
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # its own session: the peer and its workers
    proc.wait()


# -- talking to it ----------------------------------------------------------------------

Address = tuple[str, int]


async def rpc(addr: Address, kind: str, body: dict[str, Any], timeout: float = 15.0) -> Any:
    """One request to the peer, as the CLI sends it (``--insecure``)."""
    from agiledart.overlay.auth import ClusterKey
    from agiledart.overlay.tcp import FrameClient

    key = ClusterKey.for_insecure_mode()
    client = await FrameClient.connect(*addr, key=key, name="bench", timeout=timeout)
    async with client:
        return await client.request(kind, body, timeout=timeout)


async def wait_ready(addr: Address, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    from agiledart.errors import AgiledartError

    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            msg = f"peer exited with status {proc.returncode}"
            raise PeerFailed(msg)
        with contextlib.suppress(AgiledartError, OSError):
            await rpc(addr, "ring", {}, timeout=2.0)
            return
        if time.monotonic() > deadline:
            msg = f"peer did not answer within {timeout:.0f} s"
            raise PeerFailed(msg)
        await asyncio.sleep(0.2)


@dataclass
class Apps:
    """Starts, watches and removes the apps of one peer: by ``submit`` (the scheduler
    places them) or, when a one-peer ring cannot place them, by ``deploy`` + ``start``
    with every node on the peer."""

    addr: Address
    proc: subprocess.Popen[bytes]
    submit: bool = True
    cpus: set[int] = field(default_factory=set)  #: of the peer's processes, seen running

    async def launch(self, app_id: str, text: str, sets: list[str]) -> str:
        from agiledart.runtime.errors import DeployError

        if self.submit:
            try:
                reply = await rpc(self.addr, "submit", {"spec": text, "set": sets}, timeout=60)
                return str(reply["app_id"])
            except DeployError as exc:
                if not exc.no_capacity:
                    raise
                self.submit = False
                log(f"submit cannot place the app on one peer ({exc})")
                log("deploying every node on the peer with the deploy/start RPCs instead")
        await self._deploy(app_id, text, sets)
        return app_id

    async def _deploy(self, app_id: str, text: str, sets: list[str]) -> None:
        from agiledart.app.parse import parse_spec
        from agiledart.runtime.instance import Deployment

        spec = parse_spec(text, overrides=sets)
        nodes = [*(s.id for s in spec.sources), *(o.id for o in spec.operators)]
        nodes += [k.id for k in spec.sinks]
        deployment = Deployment(
            app_id=app_id,
            spec=spec,
            hosts={n: (PEER_NAME,) for n in nodes},
            addresses={PEER_NAME: self.addr},
            scheduler=self.addr,
        )
        await rpc(self.addr, "deploy", deployment.to_wire(), timeout=60)
        await rpc(self.addr, "start", {"app_id": app_id})

    async def stats(self, app_id: str) -> tuple[str, dict[str, Any]]:
        """``(state, the peer's statistics of the app)``."""
        if self.proc.poll() is not None:
            msg = f"peer exited with status {self.proc.returncode}"
            raise PeerFailed(msg)
        if self.submit:
            view = await rpc(self.addr, "status", {"app_id": app_id})
            return str(view["state"]), dict(view.get("peers", {}).get(PEER_NAME) or {})
        got = await rpc(self.addr, "app_stats", {"app_id": app_id})
        if got is None:
            return "stopped", {}
        if got.get("failure"):
            return "failed", got
        sinks = got.get("sinks", {}).values()
        return ("finished" if sinks and all(s["done"] for s in sinks) else "running"), got

    async def remove(self, app_id: str, state: str) -> None:
        if not self.submit:
            await rpc(self.addr, "undeploy", {"app_id": app_id})
        elif state not in TERMINAL:
            await rpc(self.addr, "stop", {"app_id": app_id})


# -- one rate step ----------------------------------------------------------------------


@dataclass
class Step:
    rate: int
    ok: bool = False
    reason: str | None = None
    p50_ms: float | None = None
    p99_ms: float | None = None
    delayed: int = 0
    sink_records: int = 0
    utilization: dict[str, float] = field(default_factory=dict)
    service_us: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def cv(self) -> float | None:
        return coefficient_of_variation(list(self.utilization.values()))

    def row(self) -> dict[str, Any]:
        return {
            "rate": self.rate,
            "ok": self.ok,
            "p99_ms": self.p99_ms,
            "delayed": self.delayed,
            "sink_records": self.sink_records,
            "utilization_cv": self.cv,
            "reason": self.reason,
        }


def coefficient_of_variation(xs: list[float]) -> float | None:
    if len(xs) < 2 or statistics.fmean(xs) <= 0:
        return None
    return round(statistics.pstdev(xs) / statistics.fmean(xs), 3)


@dataclass(frozen=True)
class StepPlan:
    topology: str
    text: str  #: the spec
    code_id: str
    duration: float
    heavy_us: float
    light_us: float
    max_delayed_pct: float


async def run_step(apps: Apps, plan: StepPlan, rate: int, seq: int) -> Step:
    """One finite app at ``rate`` records/s for ``plan.duration`` seconds, judged."""
    count = max(1, round(rate * plan.duration))
    allowed = int(count * plan.max_delayed_pct / 100)
    sets = [
        f'params.code="{plan.code_id}"',
        f"params.rate={rate}",
        f"params.count={count}",
        f"params.heavy_us={plan.heavy_us}",
        f"params.light_us={plan.light_us}",
        f"params.peer={PEER_NAME}",
    ]
    started = time.monotonic()
    app_id = await apps.launch(f"riot-{plan.topology}-{seq}-{rate}", plan.text, sets)
    deadline = time.monotonic() + 3 * plan.duration + 30
    samples: list[dict[str, Any]] = []
    st: dict[str, Any] = {}
    state, abort = "running", None
    while state not in TERMINAL and abort is None:
        await asyncio.sleep(0.5)
        state, st = await apps.stats(app_id)
        sources = _sources(st)
        progress = sum(s.get("emitted", 0) for s in sources) / count
        behind = sum(s.get("delayed", 0) + s.get("shed", 0) for s in sources)
        if state == "running":
            apps.cpus |= process_tree_cpus(apps.proc.pid)
            if 0.5 <= progress <= 0.95:
                samples.append(st.get("operators", {}))
        if state == "running" and behind > allowed:
            abort = f"source fell behind: {behind} of {count} records > 100 ms late"
        elif state == "running" and time.monotonic() > deadline:
            abort = f"not finished {3 * plan.duration + 30:.0f} s after the start"
    await apps.remove(app_id, state)
    step = judge(rate, count, allowed, state, st, abort)
    samples = samples or [st.get("operators", {})]
    step.utilization = mean_of(samples, "utilization")
    step.service_us = mean_of(samples, "service_us")
    step.seconds = round(time.monotonic() - started, 1)
    return step


def process_tree_cpus(pid: int) -> set[int]:
    """The CPUs the process ``pid`` and all its descendants may run on."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(stat.parent.name))
    cpus: set[int] = set()
    todo = [pid]
    while todo:
        p = todo.pop()
        with contextlib.suppress(OSError):
            cpus |= os.sched_getaffinity(p)
        todo += children.get(p, [])
    return cpus


def _sources(st: dict[str, Any]) -> list[dict[str, Any]]:
    return list(st.get("sources", {}).values())


def mean_of(samples: list[dict[str, Any]], figure: str) -> dict[str, float]:
    """Per operator, the mean of ``figure`` over the polls that have it."""
    out: dict[str, float] = {}
    for op in sorted({op for s in samples for op in s}):
        xs = [s[op][figure] for s in samples if s.get(op, {}).get(figure) is not None]
        if xs:
            out[op] = round(statistics.fmean(xs), 4)
    return out


def judge(
    rate: int, count: int, allowed: int, state: str, st: dict[str, Any], abort: str | None
) -> Step:
    """Whether the step sustained ``rate`` (see the module doc), with its figures."""
    sources, sinks = _sources(st), list(st.get("sinks", {}).values())
    ops = list(st.get("operators", {}).values())
    emitted = sum(s.get("emitted", 0) for s in sources)
    behind = sum(s.get("delayed", 0) + s.get("shed", 0) for s in sources)
    errors = sum(x.get("errors", 0) for x in [*ops, *sinks])
    p99s = [s["latency_p99_ms"] for s in sinks if s.get("latency_p99_ms") is not None]
    p50s = [s["latency_p50_ms"] for s in sinks if s.get("latency_p50_ms") is not None]
    step = Step(
        rate=rate,
        p50_ms=max(p50s) if p50s else None,
        p99_ms=max(p99s) if p99s else None,
        delayed=behind,
        sink_records=sum(s.get("records", 0) for s in sinks),
    )
    if abort is not None:
        step.reason = abort
    elif state != "finished":
        step.reason = f"app {state}: {st.get('failure')}"
    elif emitted != count or errors or any(s.get("dropped", 0) for s in sinks):
        step.reason = f"records lost: emitted {emitted} of {count}, {errors} errors"
    elif behind > allowed:
        step.reason = f"source fell behind: {behind} of {count} records > 100 ms late"
    elif step.p99_ms is None:
        step.reason = "no latency samples reached the sink"
    elif step.p99_ms > LATENCY_BUDGET_MS:
        step.reason = f"p99 {step.p99_ms:.0f} ms > {LATENCY_BUDGET_MS:.0f} ms"
    else:
        step.ok = True
    return step


# -- the sweep --------------------------------------------------------------------------


@dataclass(frozen=True)
class SweepPlan:
    start: int
    factor: float
    max_rate: int
    bisect: int
    max_steps: int


async def sweep(
    check: Callable[[int], Awaitable[Step]], plan: SweepPlan, steps: list[Step]
) -> None:
    """Rates tried, appended to ``steps`` in order: ``start`` times ``factor`` until a
    step fails (or down from ``start`` when the first one fails), then ``bisect``
    geometric bisections."""
    best: Step | None = None
    fail: Step | None = None
    rate = plan.start
    while len(steps) < plan.max_steps and 1 <= rate <= plan.max_rate:
        step = await check(rate)
        steps.append(step)
        if step.ok:
            best = step
            if fail is not None:
                break  # came down from a failing start
            rate = _round_rate(rate * plan.factor)
        else:
            fail = step
            if best is not None:
                break
            rate = _round_rate(rate / plan.factor)
    for _ in range(plan.bisect):
        if best is None or fail is None or len(steps) >= plan.max_steps:
            break
        mid = _round_rate(math.sqrt(best.rate * fail.rate))
        if mid in (best.rate, fail.rate):
            break
        step = await check(mid)
        steps.append(step)
        best, fail = (step, fail) if step.ok else (best, step)


def _round_rate(x: float) -> int:
    """Two significant digits: 5657 -> 5700."""
    if x < 10:
        return max(1, round(x))
    scale = 10 ** (int(math.log10(x)) - 1)
    return int(round(x / scale) * scale)


def sustained(steps: list[Step]) -> tuple[Step | None, str | None]:
    """The best sustained step, and a note: why there is none, or that it is only a
    lower bound (no step failed)."""
    ok = [s for s in steps if s.ok]
    if not ok:
        lowest = min(steps, key=lambda s: s.rate) if steps else None
        if lowest is None:
            return None, "no step ran"
        return None, f"not sustained even at {lowest.rate}/s: {lowest.reason}"
    best = max(ok, key=lambda s: s.rate)
    if not any(not s.ok and s.rate > best.rate for s in steps):
        return best, f"lower bound: no rate tried (up to {best.rate}/s) failed"
    return best, None


# -- per scheduler ----------------------------------------------------------------------


@dataclass
class Session:
    """One scheduler's peer and what its sweeps found."""

    scheduler: str
    command: str
    outcomes: dict[str, list[Step]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)  #: topology -> what cut it short
    deploy: str | None = None  #: submit | direct
    engine: dict[str, Any] | None = None  #: the peer's own account (``ring``)
    cpus: list[int] = field(default_factory=list)


WARM_UP_RATE = 100
#: what ``ring`` says of the peer's engine that does not change as it runs
ENGINE_KEYS = ("scheduler", "workers", "turn", "lachesis")


async def sweep_all(
    session: Session, peer: PeerProcess, addr: Address, args: argparse.Namespace
) -> None:
    """Every topology's sweep on one running peer, after an unjudged warm-up step
    (pool workers start and load the code on first use)."""
    await wait_ready(addr, peer.proc)
    ring = await rpc(addr, "ring", {})
    engine = ring.get("execution", {})
    session.engine = {k: v for k, v in engine.items() if k in ENGINE_KEYS}
    source = (RIOT / "ops.py").read_bytes()
    code_id = (await rpc(addr, "register", {"source": source, "name": "ops.py"}))["code_id"]
    apps = Apps(addr, peer.proc)
    sweep_plan = SweepPlan(args.start_rate, args.factor, args.max_rate, args.bisect, args.steps)
    seq = 0
    for topology in args.topologies:
        text = (RIOT / f"{topology}.yaml").read_text()
        plan = StepPlan(
            topology,
            text,
            code_id,
            args.duration,
            args.heavy_us,
            args.light_us,
            args.max_delayed_pct,
        )

        async def check(rate: int, plan: StepPlan = plan, *, warm_up: bool = False) -> Step:
            nonlocal seq
            seq += 1
            run = dataclasses.replace(plan, duration=min(1.0, plan.duration)) if warm_up else plan
            step = await run_step(apps, run, rate, seq)
            verdict = "ok" if step.ok else f"FAIL ({step.reason})"
            log(
                f"{plan.topology} {session.scheduler} {rate}/s{' warm-up' * warm_up}: "
                f"{verdict}; p99 {step.p99_ms} ms, {step.delayed} late, "
                f"{step.sink_records} out, utilization cv {step.cv} [{step.seconds:.1f} s]"
            )
            await asyncio.sleep(0.5)  # let the peer settle
            return step

        session.outcomes[topology] = []
        if seq == 0:
            await check(WARM_UP_RATE, warm_up=True)
        await sweep(check, sweep_plan, session.outcomes[topology])
        session.deploy = "submit" if apps.submit else "direct"
        session.cpus = sorted(apps.cpus)


def run_scheduler(scheduler: str, args: argparse.Namespace, flags: PeerFlags) -> Session:
    """Start the peer for ``scheduler``, sweep every topology, stop it. A failure (the
    peer died, an RPC failed) ends the sweeps; what they measured before stays."""
    from agiledart.errors import AgiledartError

    port = free_port()
    argv = peer_args(scheduler, args, flags, port)
    session = Session(scheduler, shlex.join(["agiledart", *argv]))
    log(f"{scheduler}: {session.command} (pinned to CPUs {args.cpus})")
    with running_peer(argv, args.cpus) as peer:
        try:
            asyncio.run(sweep_all(session, peer, ("127.0.0.1", port), args))
        except (PeerFailed, AgiledartError, OSError) as exc:
            alive = "running" if peer.proc.poll() is None else f"exited {peer.proc.returncode}"
            error = f"{type(exc).__name__}: {exc} (peer {alive}; its log: {peer.log_tail()})"
            log(f"{scheduler}: {error}")
            done = [t for t in args.topologies if t in session.outcomes][:-1]
            session.errors = {t: error for t in args.topologies if t not in done}
    return session


# -- operator costs (measured here, not on the peer) ------------------------------------


def op_costs(topology: str, args: argparse.Namespace, n: int) -> dict[str, float]:
    """CPU microseconds per record of each operator, running the topology's functions
    in this process over ``n`` readings (unions cost nothing and show 0)."""
    from agiledart.app.functions import bind
    from agiledart.app.graph import topological_order
    from agiledart.app.parse import parse_spec
    from agiledart.datasets import generate

    ops = _load_ops()
    sets = [f'params.code="{"0" * 63}a"', f"params.heavy_us={args.heavy_us}"]
    sets.append(f"params.light_us={args.light_us}")
    spec = parse_spec((RIOT / f"{topology}.yaml").read_text(), overrides=sets)
    streams = {s.id: list(generate("urban", seed=5, rate=1000, count=n)) for s in spec.sources}
    costs: dict[str, float] = {}
    for node in topological_order(spec):
        o = next((o for o in spec.operators if o.id == node), None)
        if o is None:
            continue
        xs = [r for i in o.inputs for r in streams[i]]
        if o.fn is None:  # union
            streams[o.id], costs[o.id] = xs, 0.0
            continue
        fn = bind(getattr(ops, o.fn.split(":")[1]), o.params)
        t = time.thread_time()
        if o.op == "flat_map":
            streams[o.id] = [y for x in xs for y in fn(x)]
        else:
            streams[o.id] = [fn(x) for x in xs]
        costs[o.id] = round((time.thread_time() - t) / max(1, len(xs)) * 1e6, 1)
    return costs


def _load_ops() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("riot_ops", RIOT / "ops.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- report -----------------------------------------------------------------------------


def topology_report(
    topology: str, sessions: dict[str, Session], skipped: dict[str, str], requested: bool
) -> Any:
    """One topology's figures per scheduler (null with a ``note`` saying why), the
    ratios beside their anchors, and every step tried."""
    rate: dict[str, int | None] = {}
    cv: dict[str, float | None] = {}
    p99: dict[str, float | None] = {}
    service: dict[str, dict[str, float] | None] = {}
    note: dict[str, str | None] = {}
    steps: dict[str, list[dict[str, Any]]] = {}
    for s in ALL_SCHEDULERS:
        got = sessions.get(s)
        best: Step | None = None
        steps[s] = [x.row() for x in got.outcomes.get(topology, [])] if got else []
        if not requested:
            why: str | None = "topology not requested"
        elif got is None:
            why = skipped.get(s, "not requested")
        else:
            best, why = sustained(got.outcomes.get(topology, []))
            if topology in got.errors:
                why = f"sweep cut short: {got.errors[topology]}"
        rate[s] = None if best is None else best.rate
        cv[s] = None if best is None else best.cv
        p99[s] = None if best is None else best.p99_ms
        service[s] = None if best is None else best.service_us
        note[s] = why
    report: dict[str, Any] = {"rate": rate, "utilization_cv": cv, "p99_ms": p99, "note": note}
    report["service_us"] = service
    for name, a, b in RATIOS:
        x, y = rate[a], rate[b]
        bracketed = note[a] is None and note[b] is None  # not a lower bound, not cut short
        report[name] = round(x / y, 2) if x is not None and y and bracketed else None
        report[f"{name}_anchor"] = ANCHORS[topology][name]
    report["anchor_source"] = ANCHORS[topology]["source"]
    report["steps"] = steps
    return report


# -- main -------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print one JSON object last")
    p.add_argument(
        "--quick", action="store_true", help="tiny (the CI test): one 1 s step at 200/s per sweep"
    )
    p.add_argument(
        "--schedulers",
        default=",".join(SCHEDULERS),
        help=f"comma list of {', '.join(ALL_SCHEDULERS)} (default: the first four)",
    )
    p.add_argument("--topologies", default=",".join(TOPOLOGIES), help="comma list: stats,pred")
    p.add_argument("--duration", type=float, help="seconds of input per rate step (10)")
    p.add_argument("--lachesis-policy", default="qs", choices=("qs", "fcfs", "hr"), help="(qs)")
    p.add_argument("--turn", type=int, default=50, help="tuples per turn (EdgeWise: 50)")
    p.add_argument(
        "--offload-us",
        type=float,
        default=0.0,
        help="the peers' --offload-us: 0 (default) puts every operator under the scheduler "
        "being measured; the peer's own default (10) keeps cheap ones in its loop",
    )
    p.add_argument("--start-rate", type=int, help="first rate, records/s (500)")
    p.add_argument("--factor", type=float, default=2.0, help="rate step up (2)")
    p.add_argument("--bisect", type=int, help="bisection steps after the first failure (2)")
    p.add_argument("--steps", type=int, help="rate steps per sweep at most (10)")
    p.add_argument("--max-rate", type=int, default=64_000, help="highest rate tried (64000)")
    p.add_argument("--heavy-us", type=float, default=60.0, help="busy loop of heavy ops, us (60)")
    p.add_argument("--light-us", type=float, default=5.0, help="busy loop of the others, us (5)")
    p.add_argument(
        "--max-delayed-pct",
        type=float,
        default=1.0,
        help="records the source may emit > 100 ms late, in %% of the step's (1)",
    )
    args = p.parse_args(argv)
    quick = {"duration": 1.0, "start_rate": 200, "bisect": 0, "steps": 1}
    full = {"duration": 10.0, "start_rate": 500, "bisect": 2, "steps": 10}
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.schedulers = _names(p, args.schedulers, ALL_SCHEDULERS)
    args.topologies = _names(p, args.topologies, TOPOLOGIES)
    args.cpus = sorted(os.sched_getaffinity(0))[:2]
    return args


def _names(p: argparse.ArgumentParser, text: str, known: tuple[str, ...]) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in names if x not in known]
    if bad or not names:
        p.error(f"choose from {', '.join(known)}; got {text!r}")
    return names


def plan_schedulers(requested: list[str], flags: PeerFlags) -> tuple[list[str], dict[str, str]]:
    """Schedulers to run, and why each requested one that will not run is skipped."""
    skipped = {s: why for s in requested if (why := flags.refuses(s))}
    run = [s for s in requested if s not in skipped]
    if not flags.scheduler and INLINE not in run:
        run.append(INLINE)
    return run, skipped


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    began, steal_before = time.monotonic(), cpu_steal()
    if len(args.cpus) < 2:
        log(f"only {len(args.cpus)} CPU(s) available: the peer gets {args.cpus}")
    flags = peer_flags()
    run, skipped = plan_schedulers(args.schedulers, flags)
    if not flags.scheduler:
        log("!" * 72)
        log("agiledart peer has no --scheduler flag: running only the pseudo-scheduler")
        log("'inline' (the peer without the flag); edgewise/random/os/lachesis are null")
        log("!" * 72)
    costs = {t: op_costs(t, args, 300 if args.quick else 3000) for t in args.topologies}
    for t, c in costs.items():
        log(f"{t}: CPU us per record, measured here: {c}")
    sessions = {s: run_scheduler(s, args, flags) for s in run}
    report: dict[str, Any] = {
        t: topology_report(t, sessions, skipped, t in args.topologies) for t in TOPOLOGIES
    }
    report |= {
        "schedulers": run,
        "scheduler_flags": flags.scheduler,
        "lachesis_policy": args.lachesis_policy,
        "turn": args.turn if flags.turn else None,
        "offload_us": args.offload_us if flags.offload else None,
        "duration_s": args.duration,
        "latency_budget_ms": LATENCY_BUDGET_MS,
        "max_delayed_pct": args.max_delayed_pct,
        "heavy_us": args.heavy_us,
        "light_us": args.light_us,
        "op_cost_us": costs,
        "peer_commands": {s: x.command for s, x in sessions.items()},
        "engines": {s: x.engine for s, x in sessions.items()},
        "deploy": {s: x.deploy for s, x in sessions.items()},
        "peer_cpus": {s: x.cpus for s, x in sessions.items()},
        "elapsed_s": round(time.monotonic() - began, 1),
        "cpu_steal_pct": steal_pct(steal_before, cpu_steal()),
        "python": platform.python_version(),
    }
    print(json.dumps(report) if args.json else json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
