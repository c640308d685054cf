"""Elastic scaling under input steps (issue 8; paper §IV-C; docs/scaling.md).

A bottleneck operator runs at its right parallelism for the base load; at ``t = 10 s``
its input rate steps up by x2 (one run) and x4 (another). The peer-side driver
(:class:`agiledart.runtime.scaling.ElasticDriver`, the code the peers run: counters in,
:func:`~agiledart.runtime.scaling.rates`, the secant controller, resize) decides once a
second; we report, per step:

* ``decisions_to_target``: changes of the instance count from the step until f >= f*
  (0.9) holds (for ``--hold`` seconds in a row);
* ``seconds_to_target``: from the step to the start of that stretch;
* ``overshoot``: the most instances beyond the right parallelism (the least x with
  f(x) >= f* under the new load, from the true rates);
* ``oscillations``: reversals of direction of the instance count after the step.

The plant is the operator as the runtime measures it, in virtual time: a bounded
inbox (``--inbox`` records) in front of x replicas serving mu records/s each (every
second's cost drawn with ``--noise`` relative spread, seeded), credit back-pressure
throttling what the inbox accepts (so the *measured* input rate is at most what is
processed once the inbox is full, as on a peer), and a new replica count taking effect
``--warmup`` s after the decision (state split, workers taking the replicas).

Anchor, side by side on the same plant: DS2 (Kalavri et al., OSDI'18), which sets the
parallelism from the true processing rate and the source's target rate,
x = ceil(lambda / (rho_ref * mu)) with the same utilisation target, and reaches the
right parallelism "in at most three steps" (the paper's claim).

    python scripts/bench_scaling.py --json
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import random
import sys
from dataclasses import dataclass, field
from typing import Any

from agiledart.app import parse_spec
from agiledart.app.spec import ScalingSpec
from agiledart.runtime.scaling import ElasticDriver
from agiledart.scaling import health

STEP_AT = 10.0
REFERENCE_UTILIZATION = 0.7  # the health model's rho_ref (f = 0.9 there)


@dataclass
class _Stats:
    wait_s: float = 0.0


@dataclass
class _Edge:
    stats: _Stats = field(default_factory=_Stats)


@dataclass
class _Config:
    workers: int


@dataclass
class _Engine:
    config: _Config
    chains: bool = False


@dataclass
class Segment:
    """The counters the driver reads (those of agiledart.runtime.instance.Segment)."""

    ops: list[str]
    replicas: int = 1
    scalable: bool = True
    arrived: int = 0
    executed: int = 0
    service_s: float = 0.0
    pending: int = 0


class Plant:
    """One operator on one peer, in virtual time, as the driver sees an AppInstance."""

    def __init__(self, *, mu: float, inbox: int, warmup: float, workers: int) -> None:
        self.spec = parse_spec(
            {
                "name": "bench",
                "sources": [
                    {
                        "id": "src",
                        "peer": "p",
                        "connector": "generator",
                        "params": {"dataset": "counter", "rate": 1, "count": 1},
                    }
                ],
                "operators": [
                    {"id": "op", "op": "map", "fn": "builtin:identity", "inputs": ["src"]}
                ],
                "sinks": [{"id": "out", "peer": "p", "connector": "discard", "inputs": ["op"]}],
            }
        )
        self.app_id, self.me = "bench-1", "p"
        self.engine = _Engine(_Config(workers))
        self.segments = [Segment(["op"])]
        self.edges = {"op": [_Edge()]}
        self.mu, self.inbox, self.warmup = mu, inbox, warmup
        self.queue = 0.0
        self.effective: list[tuple[float, int]] = []  #: (from when, replicas) to apply
        self.now = 0.0
        self._carry = [0.0, 0.0]

    def resize(self, seg: Segment, n: int) -> None:
        self.effective.append((self.now + self.warmup, n))

    def spawn(self, coro: Any) -> None:  # scale-out requests: none on this plant
        coro.close()

    def advance(self, dt: float, offered: float, mu: float) -> None:
        seg = self.segments[0]
        self.now += dt
        while self.effective and self.effective[0][0] <= self.now:
            seg.replicas = self.effective.pop(0)[1]
        accepted = min(offered * dt, self.inbox - self.queue + seg.replicas * mu * dt)
        done = min(self.queue + accepted, seg.replicas * mu * dt)
        self.queue += accepted - done
        self._carry[0] += accepted
        self._carry[1] += done
        arrived, executed = int(self._carry[0]), int(self._carry[1])
        self._carry[0] -= arrived
        self._carry[1] -= executed
        seg.arrived += arrived
        seg.executed += executed
        seg.service_s += executed / mu
        seg.pending = int(self.queue)


def right_parallelism(rate: float, mu: float, target: float) -> int:
    """The least x whose steady health (no backlog) is at least ``target``."""
    x = 1
    while health(x, rate=rate, service_rate=mu, queue=0).value < target - 1e-9:
        x += 1
    return x


def summarise(
    trace: list[tuple[float, int, float, str]], *, x_star: int, target: float, hold_s: float
) -> dict[str, Any]:
    """From (t, instances, health, action) per tick after the step: the figures."""
    decisions = 0
    reached: float | None = None
    decisions_at: int | None = None
    since: float | None = None
    counted = 0
    for t, _, f, action in trace:
        if action in ("up", "down"):
            decisions += 1
        if f >= target:
            if since is None:
                since, counted = t, decisions
            if t - since >= hold_s and reached is None:
                reached, decisions_at = since, counted
        else:
            since = None
    counts = [x for _, x, _, _ in trace]
    moves = [b - a for a, b in itertools.pairwise(counts) if b != a]
    reversals = sum(1 for a, b in itertools.pairwise(moves) if (a > 0) != (b > 0))
    return {
        "decisions_to_target": decisions_at,
        "seconds_to_target": None if reached is None else round(reached - STEP_AT, 2),
        "overshoot": max(0, max(counts) - x_star),
        "oscillations": reversals,
        "right_parallelism": x_star,
        "final_instances": counts[-1],
        "decisions": decisions,
    }


def run_step(
    factor: float, args: argparse.Namespace, *, policy: str
) -> tuple[dict[str, Any], list[Any]]:
    rng = random.Random(args.seed + int(factor * 10))
    plant = Plant(mu=args.mu, inbox=args.inbox, warmup=args.warmup, workers=args.max_instances)
    settings = ScalingSpec(
        enabled=policy == "secant",  # DS2 runs: the driver measures and scores only
        max_instances=args.max_instances,
        cooldown_ms=int(args.cooldown * 1000),
        interval_ms=1000,
    )
    driver = ElasticDriver(plant, settings, clock=lambda: plant.now)  # type: ignore[arg-type]
    base = args.rate
    x0 = right_parallelism(base, args.mu, 0.9)
    plant.segments[0].replicas = x0
    seg = plant.segments[0]
    trace: list[tuple[float, int, float, str]] = []
    dt, last_ds2 = 0.05, -math.inf
    mu_now = args.mu
    for i in range(int(args.duration / dt)):
        if i % int(1 / dt) == 0:  # a new second: its cost per record
            mu_now = args.mu * math.exp(rng.gauss(0.0, args.noise))
        offered = base * (factor if plant.now >= STEP_AT else 1.0)
        plant.advance(dt, offered, mu_now)
        if (i + 1) % int(1 / dt):
            continue
        decisions = asyncio.run(driver.tick())
        if not decisions:  # samples restarted (a new count): nothing measured yet
            continue
        f, action = decisions[0].health, decisions[0].action.value
        if policy == "ds2":  # the anchor: its own rule on the same plant and rates
            action = "hold"
            m = driver.last.get("op")
            if m is not None and plant.now - last_ds2 >= args.cooldown and not plant.effective:
                mu_est = m["service_rate"] or args.mu
                want = max(1, math.ceil(offered / (REFERENCE_UTILIZATION * mu_est)))
                want = min(want, args.max_instances)
                if want != seg.replicas:
                    action = "up" if want > seg.replicas else "down"
                    plant.resize(seg, want)
                    last_ds2 = plant.now
        if plant.now > STEP_AT:
            trace.append((plant.now, seg.replicas, f, action))
    x_star = right_parallelism(base * factor, args.mu, 0.9)
    return summarise(trace, x_star=x_star, target=0.9, hold_s=args.hold), trace


# -- live: real peer processes ----------------------------------------------------------

LIVE_CODE = """\
import time

BASE_S, STEP_AT = {base_s}, {step_at}


def x2(r):
    time.sleep(BASE_S * (2 if r["seq"] >= STEP_AT else 1))
    return r


def x4(r):
    time.sleep(BASE_S * (4 if r["seq"] >= STEP_AT else 1))
    return r
"""


def live_step(cluster: Any, code: str, step: str, args: argparse.Namespace) -> dict[str, Any]:
    """One app on the live peer: its operator's cost per record steps by ``step`` after
    ``STEP_AT`` s of records; the instance count and health are polled from status."""
    import subprocess
    import tempfile
    import time
    from pathlib import Path

    import yaml

    rate, base_s = args.live_rate, args.live_cost_ms / 1000.0
    count = int(rate * (STEP_AT + args.live_after))
    spec = {
        "name": f"step-{step}",
        "checkpoint": {"mode": "restart"},
        "scaling": {
            "enabled": True,
            "max_instances": args.live_workers,
            "cooldown_ms": int(args.cooldown * 1000),
        },
        "sources": [
            {
                "id": "src",
                "peer": "sensor-1",
                "connector": "generator",
                "params": {"dataset": "counter", "rate": rate, "count": count, "keys": 64},
            }
        ],
        "operators": [{"id": "op", "op": "map", "fn": f"{code}:{step}", "inputs": ["src"]}],
        "sinks": [{"id": "out", "peer": "sensor-1", "connector": "discard", "inputs": ["op"]}],
    }
    key = ["--cluster-key-file", str(cluster.workdir / "cluster.key")]
    via = ["--via", "{}:{}".format(*cluster.address(0))]
    cli = [sys.executable, "-m", "agiledart.cli", "--log-level", "warning"]
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(spec, f)
    out = subprocess.run(
        [*cli, "submit", f.name, *via, "--json", *key], capture_output=True, text=True, check=True
    )
    Path(f.name).unlink()
    app_id = json.loads(out.stdout)["app_id"]
    samples: list[tuple[float, int, float, str]] = []
    stepped: float | None = None
    started = time.monotonic()
    while time.monotonic() - started < STEP_AT + args.live_after + 60:
        st = json.loads(
            subprocess.run(
                [*cli, "status", app_id, *via, "--json", *key],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )
        now = time.monotonic() - started
        peers = st.get("scaling", {}).get("op", {}).get("peers", {})
        view = next(iter(peers.values()), None)
        done = sum(
            o.get("records_in", 0)
            for p in st.get("peers", {}).values()
            for o in [p.get("operators", {}).get("op", {})]
        )
        if stepped is None and done >= rate * STEP_AT:
            stepped = now
        if view and view.get("last"):
            last = view["last"]
            if args.verbose:
                keep = ("action", "instances", "health", "rate", "service_rate", "queue", "busy")
                print(round(now, 1), {k: last.get(k) for k in keep}, file=sys.stderr)
            samples.append((now, int(view["instances"]), float(last["health"]), last["action"]))
        if st["state"] not in ("deploying", "running"):
            break
        if st["totals"]["source_records"] >= count:  # the input ended: so did the step
            subprocess.run([*cli, "stop", app_id, *via, *key], capture_output=True, check=False)
            break
        time.sleep(0.5)
    if stepped is None or view is None:
        return {"error": "the step was not reached", "state": st["state"]}
    # the controller's own timeline (one row a decision, wall-clock stamped) from the
    # step on: the step's records come STEP_AT s after the sources started
    start_wall = min(float(p["started_at"]) for p in st["peers"].values() if p["started_at"])
    step_wall = start_wall + STEP_AT
    rows = [
        (at - step_wall + STEP_AT, x, f, a) for at, x, f, a in view["recent"] if at >= step_wall
    ]
    # the right parallelism from the service rate measured after the step (sleeping
    # costs more than asked on a busy machine), the nominal one beside it
    measured = view["last"].get("service_rate") or 1.0 / (base_s * {"x2": 2, "x4": 4}[step])
    x_star = right_parallelism(rate, measured, 0.9)
    result = summarise(rows, x_star=x_star, target=0.9, hold_s=args.hold)
    result["service_rate_after"] = measured
    result["changes_before_step"] = sum(
        1 for at, _, _, a in view["recent"] if at < step_wall and a in ("up", "down")
    )
    changes = view.get("changes", []) if view else []
    result["changes"] = [
        {k: c[k] for k in ("action", "instances", "target", "health")} for c in changes
    ]
    return result


def live(args: argparse.Namespace) -> dict[str, Any]:
    """Both steps on one real peer (``--workers`` = ``--live-workers``)."""
    import tempfile
    from pathlib import Path

    from benchlib import free_port

    from agiledart.emulation import LocalCluster

    root = Path(tempfile.mkdtemp(prefix="bench-scaling-"))
    cluster = LocalCluster(
        1,
        port=free_port(),
        workdir=root,
        extra_args=["--workers", str(args.live_workers)],
    )
    results: dict[str, Any] = {}
    with cluster:
        asyncio.run(cluster.wait_formed())
        bundle = root / "steps.py"
        step_at = int(args.live_rate * STEP_AT)
        bundle.write_text(LIVE_CODE.format(base_s=args.live_cost_ms / 1000.0, step_at=step_at))
        import subprocess

        key = ["--cluster-key-file", str(root / "cluster.key")]
        via = ["--via", "{}:{}".format(*cluster.address(0))]
        code = subprocess.run(
            [sys.executable, "-m", "agiledart.cli", "register", str(bundle), *via, *key],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        for step in args.live_steps.split(","):
            results[step] = live_step(cluster, code, step, args)
    return results


#: the robustness sweep: (base rate, mu) pairs, noise levels and seeds
SWEEP_LOADS = ((60.0, 100.0), (70.0, 90.0), (45.0, 100.0), (100.0, 130.0))
SWEEP_NOISE = (0.05, 0.1)
SWEEP_SEEDS = range(6)


def sweep(args: argparse.Namespace) -> dict[str, Any]:
    """Both steps over SWEEP_LOADS x SWEEP_NOISE x SWEEP_SEEDS: how many runs meet the
    acceptance (<= 3 decisions, no oscillation), per noise level, and the worst run."""
    out: dict[str, Any] = {}
    for noise in SWEEP_NOISE:
        runs, ok, worst = 0, 0, None
        for rate, mu in SWEEP_LOADS:
            for seed in SWEEP_SEEDS:
                run_args = argparse.Namespace(
                    **{**vars(args), "rate": rate, "mu": mu, "noise": noise, "seed": seed}
                )
                for factor in (2.0, 4.0):
                    r = run_step(factor, run_args, policy="secant")[0]
                    runs += 1
                    good = (r["decisions_to_target"] or 99) <= 3 and r["oscillations"] == 0
                    ok += good
                    badness = (r["oscillations"], r["decisions_to_target"] or 99)
                    if not good and (worst is None or badness > worst[0]):
                        worst = (
                            badness,
                            {"rate": rate, "mu": mu, "seed": seed, "step": factor, **r},
                        )
        out[f"noise_{noise:g}"] = {
            "runs": runs,
            "meeting_acceptance": ok,
            "worst": None if worst is None else worst[1],
        }
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--json", action="store_true", help="one JSON object on the last line")
    p.add_argument("--rate", type=float, default=60.0, help="base input rate, records/s")
    p.add_argument("--mu", type=float, default=100.0, help="records/s one replica serves")
    p.add_argument("--noise", type=float, default=0.05, help="relative spread of mu per second")
    p.add_argument("--inbox", type=int, default=4000, help="records the inbox holds at most")
    p.add_argument("--warmup", type=float, default=0.5, help="s until a new count runs")
    p.add_argument("--cooldown", type=float, default=5.0, help="s between two changes")
    p.add_argument("--max-instances", type=int, default=8)
    p.add_argument("--duration", type=float, default=90.0, help="virtual seconds per run")
    p.add_argument("--hold", type=float, default=10.0, help="s f >= 0.9 must hold")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--no-sweep", action="store_true", help="skip the robustness sweep")
    p.add_argument("--live", action="store_true", help="also run both steps on a real peer")
    p.add_argument("--verbose", action="store_true", help="live: print every status sample")
    p.add_argument("--live-rate", type=int, default=200, help="live: records/s")
    p.add_argument("--live-cost-ms", type=float, default=2.0, help="live: base cost a record")
    p.add_argument("--live-workers", type=int, default=6, help="live: the peer's workers")
    p.add_argument("--live-steps", default="x2,x4", help="live: which steps")
    p.add_argument("--live-after", type=float, default=40.0, help="live: s of input after")
    args = p.parse_args(argv)
    steps = {"x2": 2.0, "x4": 4.0}
    ours = {k: run_step(v, args, policy="secant")[0] for k, v in steps.items()}
    ds2 = {k: run_step(v, args, policy="ds2")[0] for k, v in steps.items()}
    for k in steps:
        o, d = ours[k], ds2[k]
        print(
            f"step {k}: right parallelism {o['right_parallelism']}; secant: "
            f"{o['decisions_to_target']} decision(s), {o['seconds_to_target']} s to f >= 0.9 "
            f"held {args.hold:g} s, overshoot {o['overshoot']}, oscillations "
            f"{o['oscillations']}; DS2: {d['decisions_to_target']} decision(s), "
            f"{d['seconds_to_target']} s",
            file=sys.stderr if args.json else sys.stdout,
        )
    robustness = None if args.no_sweep else sweep(args)
    if robustness is not None:
        for level, r in robustness.items():
            print(
                f"sweep {level}: {r['meeting_acceptance']}/{r['runs']} runs meet the acceptance",
                file=sys.stderr if args.json else sys.stdout,
            )
    live_results = live(args) if args.live else None
    if live_results is not None:
        for k, r in live_results.items():
            print(
                f"live {k}: right parallelism {r.get('right_parallelism')}; "
                f"{r.get('decisions_to_target')} decision(s), {r.get('seconds_to_target')} s, "
                f"overshoot {r.get('overshoot')}, oscillations {r.get('oscillations')}",
                file=sys.stderr if args.json else sys.stdout,
            )
    out = {
        "plant": "one operator on one peer in virtual time (bounded inbox, credit "
        "back-pressure, per-second service-time noise, replica warm-up); the peers' "
        "ElasticDriver and ScalingController decide",
        "settings": {k: v for k, v in vars(args).items() if k not in ("json", "no_sweep")},
        "decisions_to_target": {k: v["decisions_to_target"] for k, v in ours.items()},
        "seconds_to_target": {k: v["seconds_to_target"] for k, v in ours.items()},
        "oscillations": {k: v["oscillations"] for k, v in ours.items()},
        "overshoot": {k: v["overshoot"] for k, v in ours.items()},
        "right_parallelism": {k: v["right_parallelism"] for k, v in ours.items()},
        "final_instances": {k: v["final_instances"] for k, v in ours.items()},
        "anchor": {
            "ds2_claim_max_steps": 3,
            "ds2_decisions_to_target": {k: v["decisions_to_target"] for k, v in ds2.items()},
            "ds2_seconds_to_target": {k: v["seconds_to_target"] for k, v in ds2.items()},
            "ds2_oscillations": {k: v["oscillations"] for k, v in ds2.items()},
        },
        "robustness": robustness,
        "live": None
        if live_results is None
        else {
            "plant": "one real peer (--workers "
            f"{args.live_workers}): generator -> map -> discard; the map sleeps "
            f"{args.live_cost_ms:g} ms a record, x2 / x4 after {STEP_AT:g} s "
            "(the same lambda/mu step as doubling / quadrupling the input rate)",
            **{
                key: {k: v.get(key) for k, v in live_results.items()}
                for key in (
                    "decisions_to_target",
                    "seconds_to_target",
                    "oscillations",
                    "overshoot",
                    "right_parallelism",
                    "final_instances",
                    "service_rate_after",
                    "changes_before_step",
                    "changes",
                )
            },
        },
        "acceptance": all(
            v["decisions_to_target"] is not None
            and v["decisions_to_target"] <= 3
            and v["oscillations"] == 0
            for v in ours.values()
        ),
    }
    if args.json:
        print(json.dumps(out))
    else:
        print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
