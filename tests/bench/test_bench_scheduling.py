"""scripts/bench_scheduling.py keeps its output contract (a ``--quick`` run on a real
peer per scheduler), and its sweep and choice of schedulers do what its docstring says
(pure parts, no processes)."""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_scheduling.py"
SCHEDULERS = ["edgewise", "random", "os", "lachesis", "inline"]
PER_SCHEDULER = ["rate", "utilization_cv", "p99_ms", "note", "service_us", "steps"]
RATIOS = ["edgewise_vs_os", "edgewise_vs_random", "lachesis_vs_os", "lachesis_vs_edgewise"]
TOPOLOGY_KEYS = [
    "rate",
    "utilization_cv",
    "p99_ms",
    "note",
    "service_us",
    *(k for r in RATIOS for k in (r, f"{r}_anchor")),
    "anchor_source",
    "steps",
]
KEYS = [
    "stats",
    "pred",
    "schedulers",
    "scheduler_flags",
    "lachesis_policy",
    "turn",
    "offload_us",
    "duration_s",
    "latency_budget_ms",
    "max_delayed_pct",
    "heavy_us",
    "light_us",
    "op_cost_us",
    "peer_commands",
    "engines",
    "deploy",
    "peer_cpus",
    "elapsed_s",
    "cpu_steal_pct",
    "python",
]


@functools.cache
def _bench() -> ModuleType:
    if str(SCRIPT.parent) not in sys.path:  # as `python scripts/...` has it: benchlib
        sys.path.append(str(SCRIPT.parent))
    spec = importlib.util.spec_from_file_location("bench_scheduling", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _is_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _check_topology(t: dict[str, Any], ran: list[str]) -> None:
    assert list(t) == TOPOLOGY_KEYS
    for figure in PER_SCHEDULER:
        assert list(t[figure]) == SCHEDULERS, figure
    for s in SCHEDULERS:
        rate, cv, p99 = t["rate"][s], t["utilization_cv"][s], t["p99_ms"][s]
        if rate is None:  # never a silent null: the note says why
            assert isinstance(t["note"][s], str)
            assert t["note"][s]
            assert cv is None
            assert p99 is None
        else:
            assert isinstance(rate, int)
            assert rate > 0
            assert p99 is not None
            assert 0 <= p99 <= 100
            assert cv is None or (_is_number(cv) and cv >= 0)
            assert all(_is_number(v) for v in t["service_us"][s].values())
    assert all(t["steps"][s] == [] for s in SCHEDULERS if s not in ran)
    for rows in t["steps"].values():
        for row in rows:
            assert list(row) == [
                "rate",
                "ok",
                "p99_ms",
                "delayed",
                "sink_records",
                "utilization_cv",
                "reason",
            ]
            assert row["ok"] is (row["reason"] is None)
    for r in RATIOS:
        assert t[r] is None or (_is_number(t[r]) and t[r] > 0)
        assert t[f"{r}_anchor"] is None or t[f"{r}_anchor"] > 0
    assert isinstance(t["anchor_source"], str)


@pytest.mark.processes
def test_a_quick_run_reports_every_figure() -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--json"],
        check=True,
        capture_output=True,
        text=True,
        timeout=110,
    )
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert list(report) == KEYS
    ran = report["schedulers"]
    if report["scheduler_flags"]:
        assert ran == SCHEDULERS[:4]
    else:  # an engine without --scheduler: only the peer's own loop, said loudly
        assert ran == ["inline"]
        assert "no --scheduler flag" in proc.stderr
    for topology in ("stats", "pred"):
        _check_topology(report[topology], ran)
        assert set(report["op_cost_us"][topology]) >= {"parse"}
    for key in ("peer_commands", "engines", "deploy", "peer_cpus"):
        assert list(report[key]) == ran, key
    for s in ran:
        assert report["peer_commands"][s].startswith("agiledart peer --listen 127.0.0.1:")
        assert report["deploy"][s] in ("submit", "direct")
        assert len(report["peer_cpus"][s]) <= 2  # pinned, workers included
    assert report["duration_s"] == 1.0
    assert report["latency_budget_ms"] == 100.0
    assert report["cpu_steal_pct"] is None or report["cpu_steal_pct"] >= 0


# -- the pure parts ---------------------------------------------------------------------


def _sweep(capacity: int, **plan: Any) -> list[Any]:
    """The steps a sweep takes against a peer that sustains up to ``capacity``/s."""
    bench = _bench()

    async def check(rate: int) -> Any:
        ok = rate <= capacity
        return bench.Step(rate=rate, ok=ok, reason=None if ok else "too fast")

    defaults = {"start": 500, "factor": 2.0, "max_rate": 64_000, "bisect": 2, "max_steps": 10}
    steps: list[Any] = []
    asyncio.run(bench.sweep(check, bench.SweepPlan(**(defaults | plan)), steps))
    return steps


def test_a_sweep_doubles_until_a_failure_then_bisects() -> None:
    steps = _sweep(3000)
    assert [s.rate for s in steps] == [500, 1000, 2000, 4000, 2800, 3300]
    best, note = _bench().sustained(steps)
    assert best.rate == 2800
    assert note is None


def test_a_sweep_goes_down_when_the_first_rate_fails() -> None:
    steps = _sweep(300)
    assert [s.rate for s in steps] == [500, 250, 350, 300]
    assert _bench().sustained(steps)[0].rate == 300


def test_a_rate_never_failed_is_a_lower_bound_and_none_sustained_has_a_reason() -> None:
    bench = _bench()
    best, note = bench.sustained(_sweep(10**6, max_steps=2))
    assert best.rate == 1000
    assert note.startswith("lower bound")
    best, note = bench.sustained(_sweep(0, max_steps=2))
    assert best is None
    assert "too fast" in note


def test_without_the_scheduler_flag_only_inline_runs() -> None:
    bench = _bench()
    old = bench.PeerFlags(scheduler=False, choices=None, lachesis_policy=False, turn=False)
    run, skipped = bench.plan_schedulers(["edgewise", "os"], old)
    assert run == ["inline"]
    assert set(skipped) == {"edgewise", "os"}
    new = bench.PeerFlags(
        scheduler=True, choices=frozenset({"edgewise", "os"}), lachesis_policy=True, turn=True
    )
    run, skipped = bench.plan_schedulers(["edgewise", "lachesis", "inline"], new)
    assert run == ["edgewise", "inline"]
    assert "not 'lachesis'" in skipped["lachesis"]


def test_a_ratio_needs_both_rates_bracketed_by_a_failure() -> None:
    bench = _bench()
    sessions = {
        "edgewise": bench.Session("edgewise", "", outcomes={"stats": _sweep(3000)}),
        "random": bench.Session("random", "", outcomes={"stats": _sweep(1500)}),
        "os": bench.Session("os", "", outcomes={"stats": _sweep(10**6, max_steps=2)}),
    }
    t = bench.topology_report("stats", sessions, {}, True)
    assert t["rate"] == {
        "edgewise": 2800,
        "random": 1400,
        "os": 1000,
        "lachesis": None,
        "inline": None,
    }
    assert t["edgewise_vs_random"] == 2.0
    assert t["edgewise_vs_os"] is None  # os: only a lower bound
    assert t["note"]["os"].startswith("lower bound")
    assert t["note"]["lachesis"] == "not requested"
    assert t["edgewise_vs_os_anchor"] == 3.0
