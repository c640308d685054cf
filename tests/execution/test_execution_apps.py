"""Every bundled app gives the reference's results under every scheduler.

One peer process per scheduler hosts whole apps (sources and sinks pinned to it), so
every operator instance runs on that peer's engine: its own loop (``--workers 0``),
the EdgeWise or random worker pool, a process per instance (``os``), or processes
reniced by the Lachesis controller.
"""

from __future__ import annotations

import os
import signal
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.apps import check_outputs, log_sizes, quick
from support.processes import cli, cli_json, formed_cluster, poll

from agiledart import apps
from agiledart.emulation import LocalCluster

pytestmark = [pytest.mark.processes, pytest.mark.slow]

ALL_IN_WORKERS = ["--offload-us", "0"]  # every operator under the scheduler under test
SCHEDULERS = {
    "inline": ["--workers", "0"],
    "edgewise": ["--workers", "2", "--scheduler", "edgewise", *ALL_IN_WORKERS],
    "random": ["--workers", "2", "--scheduler", "random", "--turn", "7", *ALL_IN_WORKERS],
    "os": ["--scheduler", "os", *ALL_IN_WORKERS],
    "lachesis": ["--scheduler", "lachesis", "--lachesis-policy", "fcfs", *ALL_IN_WORKERS],
    # operators costing over 1 us a record move to the workers mid-stream, state and all
    "moving": ["--workers", "2", "--offload-us", "1"],
}


@pytest.fixture(scope="module", params=list(SCHEDULERS))
def solo(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    name = request.param
    root = tmp_path_factory.mktemp(name)
    with formed_cluster(root, 1, SCHEDULERS[name]) as cluster:
        yield name, cluster


def via(cluster: LocalCluster) -> list[str]:
    return ["--via", "{}:{}".format(*cluster.address(0))]


def pinned_here(name: str) -> list[str]:
    """Overrides pinning every source and sink of bundled app ``name`` to sensor-1."""
    spec = apps.load(name)
    return [f"sources.{s.id}.peer=sensor-1" for s in spec.sources] + [
        f"sinks.{k.id}.peer=sensor-1" for k in spec.sinks
    ]


@pytest.mark.parametrize("app", apps.names())
def test_bundled_app_matches_reference_under_each_scheduler(solo: Any, app: str) -> None:
    scheduler, cluster = solo
    base = pinned_here(app) + (["params.count=30000"] if app == "throughput" else [])
    overrides = base + quick(apps.load(app, overrides=base), seconds=0.7)
    spec = apps.load(app, overrides=overrides)
    logs = log_sizes(cluster)
    args = [a for o in overrides for a in ("--set", o)]
    status = cli_json(cluster, "submit", app, *args, "--wait", *via(cluster))
    check_outputs(cluster, spec, status, logs)
    engine = cli_json(cluster, "ring", *via(cluster))["execution"]
    expected = {"lachesis": "lachesis-fcfs", "moving": "edgewise"}.get(scheduler, scheduler)
    assert engine["scheduler"] == expected
    if scheduler in ("edgewise", "random"):
        assert sum(engine["turns"]) > 0  # the pool ran the operators
        assert all(pid is not None for pid in engine["pids"])
    ops = next(iter(status["peers"].values()))["operators"]
    assert set(ops) == {o.id for o in spec.operators}
    for figures in ops.values():
        assert figures["queued"] == 0
        assert figures["worker_wait_ms"] is None or figures["worker_wait_ms"] >= 0


SLOW_CODE = textwrap.dedent(
    """
    import time

    def slow(record):
        deadline = time.perf_counter() + 0.002
        while time.perf_counter() < deadline:
            pass
        return record
    """
)


def skewed_app(tmp_path: Path, cluster: LocalCluster, count: int = 200_000) -> Path:
    """A light filter and a heavy (2 ms a record) map of registered code."""
    bundle = tmp_path / "slow.py"
    bundle.write_text(SLOW_CODE)
    code_id = cli(cluster, "register", str(bundle), *via(cluster)).stdout.strip()
    spec = tmp_path / "skewed.yaml"
    spec.write_text(
        textwrap.dedent(
            f"""
            name: skewed
            sources:
              - id: readings
                peer: sensor-1
                connector: generator
                params: {{dataset: urban, rate: 2000, count: {count}, seed: 3}}
            operators:
              - {{id: light, op: filter, fn: "builtin:in_range", inputs: [readings]}}
              - {{id: heavy, op: map, fn: "{code_id}:slow", inputs: [light]}}
            sinks:
              - {{id: out, peer: sensor-1, connector: discard, inputs: [heavy]}}
            """
        )
    )
    return spec


def test_a_killed_worker_fails_its_app_and_the_pool_recovers(tmp_path: Path) -> None:
    with formed_cluster(tmp_path / "c", 1, ["--workers", "2", *ALL_IN_WORKERS]) as cluster:
        spec = skewed_app(tmp_path, cluster)
        app_id = cli(cluster, "submit", str(spec), *via(cluster)).stdout.strip()

        def busy() -> list[int] | None:
            engine = cli_json(cluster, "ring", *via(cluster))["execution"]
            turns = [t for t, pid in zip(engine["turns"], engine["pids"], strict=True) if pid]
            return engine["pids"] if turns and min(turns) > 10 else None

        for pid in poll(busy, what="both workers running turns"):  # one runs a turn
            os.kill(pid, signal.SIGKILL)

        def failed() -> dict[str, Any] | None:
            status = cli_json(cluster, "status", app_id, *via(cluster))
            return status if status["state"] == "failed" else None

        status = poll(failed, what="the app failed")
        assert "worker process" in status["error"]
        # the peer lives on, and a new app runs on a fresh worker
        spec = apps.load("word-count", overrides=pinned_here("word-count"))
        overrides = pinned_here("word-count") + quick(spec, seconds=0.5)
        args = [a for o in overrides for a in ("--set", o)]
        again = cli_json(cluster, "submit", "word-count", *args, "--wait", *via(cluster))
        assert again["state"] == "finished", again.get("error")


def test_lachesis_renices_the_instance_processes(tmp_path: Path) -> None:
    """A heavy operator's queue grows; the qs policy gives its process the lowest nice
    value, read back from the kernel while the app runs."""
    if os.geteuid() != 0:
        pytest.skip("lowering nice values needs root")
    flags = ["--scheduler", "lachesis", "--lachesis-policy", "qs", *ALL_IN_WORKERS]
    with formed_cluster(tmp_path / "c", 1, flags) as cluster:
        spec = skewed_app(tmp_path, cluster)
        app_id = cli(cluster, "submit", str(spec), *via(cluster)).stdout.strip()

        def reniced() -> dict[str, int] | None:
            procs = cli_json(cluster, "ring", *via(cluster))["execution"].get("processes", {})
            nice = {ops: os.getpriority(os.PRIO_PROCESS, pid) for ops, pid in procs.items()}
            return nice if nice.get("heavy", 0) < 0 else None

        nice = poll(reniced, what="the heavy operator's process reniced", timeout=60)
        assert nice["heavy"] < nice["light"]
        cli(cluster, "stop", app_id, *via(cluster))
