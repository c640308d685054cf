"""Lachesis: policies and translation (pure), and the controller on real processes."""

from __future__ import annotations

import asyncio
import logging
import math
import os
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agiledart.runtime.execution.lachesis import (
    CpuHierarchy,
    LachesisController,
    cgroup_dir,
    cpu_hierarchies,
    current_nice,
)
from agiledart.runtime.execution.policy import (
    LOG_SCALED,
    InstanceLoad,
    cgroup_weights,
    nice_values,
    priorities,
)


def load(
    pid: int = 1,
    queue: int = 0,
    oldest_s: float | None = None,
    service_s: float | None = None,
    selectivity: float = 1.0,
) -> InstanceLoad:
    return InstanceLoad(pid, queue, oldest_s, 10.0, service_s, selectivity)


def prios(policy: str, loads: list[InstanceLoad], seed: int = 1) -> list[float]:
    return priorities(policy, loads, rng=random.Random(seed))


# -- policies ------------------------------------------------------------------------


def test_qs_favours_longer_queues() -> None:
    assert prios("qs", [load(queue=0), load(queue=5), load(queue=10)]) == [0.0, 5.0, 10.0]


def test_fcfs_favours_the_oldest_queued_tuple() -> None:
    got = prios("fcfs", [load(oldest_s=None), load(oldest_s=2.0), load(oldest_s=0.5)])
    assert got == [0.0, 2.0, 0.5]


def test_hr_is_output_per_cpu_second_and_fills_unknown_costs_with_the_median() -> None:
    loads = [
        load(service_s=0.001, selectivity=1.0),  # 1000 tuples out per CPU second
        load(service_s=0.001, selectivity=0.5),  # 500
        load(service_s=0.01, selectivity=2.0),  # 200
        load(service_s=None),  # not measured yet
    ]
    assert prios("hr", loads) == pytest.approx([1000.0, 500.0, 200.0, 500.0])
    assert prios("hr", [load(), load()]) == [1.0, 1.0]
    assert "hr" in LOG_SCALED
    assert "qs" not in LOG_SCALED


def test_random_is_uniform_in_unit_interval_and_seeded() -> None:
    loads = [load(pid=i) for i in range(20)]
    first = prios("random", loads, seed=3)
    assert first == prios("random", loads, seed=3)
    assert all(0.0 <= p < 1.0 for p in first)
    assert len(set(first)) == len(first)


def test_unknown_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown Lachesis policy 'lifo'"):
        prios("lifo", [load()])


# -- translation ---------------------------------------------------------------------


def test_linear_nice_spans_the_whole_range() -> None:
    assert nice_values([0.0, 5.0, 10.0]) == [19, 0, -20]
    assert nice_values([3.0, 1.0], lowest=0, highest=19) == [0, 19]
    assert nice_values([]) == []
    assert nice_values([4.0, 4.0, 4.0]) == [0, 0, 0]


def test_log_nice_turns_priority_ratios_into_weight_ratios() -> None:
    got = nice_values([8.0, 4.0, 2.0, 1.0], log_scale=True)
    want = [round(-20 + math.log(8 / p, 1.25)) for p in (8, 4, 2, 1)]
    assert got == want == [-20, -17, -14, -11]


def test_log_nice_rescales_a_range_too_wide_and_puts_zero_last() -> None:
    assert nice_values([1e12, 1e6, 1.0], log_scale=True) == [-20, 0, 19]
    assert nice_values([10.0, 0.0], log_scale=True) == [-20, 19]
    assert nice_values([0.0, -1.0], log_scale=True) == [-20, 19]  # no positive top: linear


def test_bad_translation_input_is_refused() -> None:
    with pytest.raises(ValueError, match="below"):
        nice_values([1.0, 2.0], lowest=5, highest=5)
    with pytest.raises(ValueError, match="finite"):
        nice_values([1.0, math.nan])


def test_cgroup_weights_follow_the_nice_table_with_finer_steps() -> None:
    assert cgroup_weights([2.0, 2.0]) == [100, 100]
    top, middle, bottom = cgroup_weights([10.0, 5.0, 0.0])
    assert (top, bottom) == (round(100 * 1.25**20), 1)
    assert middle == round(100 * 1.25**0.5)  # nice -0.5 before rounding: finer than nice
    assert cgroup_weights([8.0, 4.0], log_scale=True) == [
        round(100 * 1.25**20),
        round(100 * 1.25 ** (20 - math.log(2, 1.25))),
    ]


@settings(max_examples=300, deadline=None)
@given(
    values=st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=30),
    log_scale=st.booleans(),
)
def test_translation_is_monotonic_and_in_range(values: list[float], log_scale: bool) -> None:
    nices = nice_values(values, log_scale=log_scale)
    weights = cgroup_weights(values, log_scale=log_scale)
    assert all(-20 <= n <= 19 for n in nices)
    assert all(1 <= w <= 10_000 for w in weights)
    order = sorted(range(len(values)), key=values.__getitem__)
    assert [nices[i] for i in order] == sorted(nices, reverse=True)
    assert [weights[i] for i in order] == sorted(weights)
    if len(set(values)) > 1:
        assert nices[order[-1]] == -20
    else:
        assert set(nices) == {0}
        assert set(weights) == {100}


# -- cgroup discovery (pure) ---------------------------------------------------------

MOUNTINFO_V1 = """\
25 30 0:22 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
33 25 0:28 / /sys/fs/cgroup/cpu rw,relatime shared:9 - cgroup cgroup rw,cpu,cpuacct
34 25 0:29 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
"""
MOUNTINFO_V2 = "30 25 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw\n"


def test_cpu_hierarchies_prefer_cgroup2() -> None:
    assert cpu_hierarchies(MOUNTINFO_V1) == [CpuHierarchy("v1", "/sys/fs/cgroup/cpu", "/")]
    both = cpu_hierarchies(MOUNTINFO_V1 + MOUNTINFO_V2)
    assert [h.version for h in both] == ["v2", "v1"]
    assert cpu_hierarchies("garbage\n") == []


def test_cgroup_dir_finds_the_process_cgroup() -> None:
    proc = "4:memory:/m\n2:cpu,cpuacct:/app/peer\n0::/user.slice/peer.scope\n"
    v1 = CpuHierarchy("v1", "/sys/fs/cgroup/cpu", "/")
    v2 = CpuHierarchy("v2", "/sys/fs/cgroup", "/")
    nested = CpuHierarchy("v1", "/sys/fs/cgroup/cpu", "/app")
    assert cgroup_dir(v1, proc) == Path("/sys/fs/cgroup/cpu/app/peer")
    assert cgroup_dir(v2, proc) == Path("/sys/fs/cgroup/user.slice/peer.scope")
    assert cgroup_dir(nested, proc) == Path("/sys/fs/cgroup/cpu/peer")
    assert cgroup_dir(v1, "0::/\n") is None


# -- the controller --------------------------------------------------------------------

SLEEPER = "import time; time.sleep(60)"
THREADED = (
    "import threading, time\n"
    "for _ in range(2): threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
    "time.sleep(60)\n"
)


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs = [
        subprocess.Popen([sys.executable, "-c", code]) for code in (SLEEPER, SLEEPER, THREADED)
    ]
    try:
        yield procs
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def threads(pid: int) -> list[int]:
    return [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]


def wait_for_threads(pid: int, n: int) -> None:
    for _ in range(2000):
        if len(threads(pid)) >= n:
            return
        time.sleep(0.005)
    pytest.fail(f"process {pid} never started {n} threads")


def queue_loads(procs: list[subprocess.Popen[bytes]]) -> list[InstanceLoad]:
    return [load(pid=proc.pid, queue=q) for proc, q in zip(procs, (0, 5, 10), strict=True)]


root_only = pytest.mark.skipif(
    os.geteuid() != 0, reason="lowering nice values and moving cgroups needs root"
)


@root_only
@pytest.mark.parametrize("use_cgroups", [False, True])
def test_controller_renices_real_processes(
    children: list[subprocess.Popen[bytes]], use_cgroups: bool
) -> None:
    wait_for_threads(children[2].pid, 3)
    before = {proc.pid: current_nice(proc.pid) for proc in children}
    homes = {proc.pid: Path(f"/proc/{proc.pid}/cgroup").read_text() for proc in children}
    lachesis = LachesisController(
        "qs", sample=lambda: queue_loads(children), use_cgroups=use_cgroups
    )
    try:
        applied = lachesis.step()
        pids = [proc.pid for proc in children]
        assert applied == dict(zip(pids, [19, 0, -20], strict=True))
        for pid, nice in applied.items():
            assert {os.getpriority(os.PRIO_PROCESS, tid) for tid in threads(pid)} == {nice}
        assert lachesis.privileged
        if use_cgroups and lachesis.cgroup_version is not None:
            weights = cgroup_weights([0.0, 5.0, 10.0])
            for pid, weight in zip(pids, weights, strict=True):
                text = Path(f"/proc/{pid}/cgroup").read_text()
                assert weight_file_matches(text, pid, weight)
    finally:
        lachesis.close()
    assert {proc.pid: current_nice(proc.pid) for proc in children} == before
    assert {proc.pid: Path(f"/proc/{proc.pid}/cgroup").read_text() for proc in children} == homes
    assert our_cgroups() == []


def our_cgroups() -> list[Path]:
    """Cgroups a controller of this process made and left behind."""
    found: list[Path] = []
    for hierarchy in cpu_hierarchies(Path("/proc/self/mountinfo").read_text()):
        own = cgroup_dir(hierarchy, Path("/proc/self/cgroup").read_text())
        if own is not None:
            found += own.glob(f"agiledart-lachesis-{os.getpid()}-*")
    return found


def weight_file_matches(proc_cgroup: str, pid: int, weight: int) -> bool:
    """The cgroup of ``pid`` carries ``weight`` (v2) or the matching cpu.shares (v1)."""
    for hierarchy in cpu_hierarchies(Path("/proc/self/mountinfo").read_text()):
        group = cgroup_dir(hierarchy, proc_cgroup)
        if group is None or group.name != f"pid-{pid}":
            continue
        if hierarchy.version == "v2":
            return (group / "cpu.weight").read_text().strip() == str(weight)
        shares = max(2, min(262_144, round(weight * 1024 / 100)))
        return (group / "cpu.shares").read_text().strip() == str(shares)
    return False


@root_only
def test_vanished_processes_are_skipped(children: list[subprocess.Popen[bytes]]) -> None:
    children[1].kill()
    children[1].wait()
    lachesis = LachesisController("qs", sample=lambda: queue_loads(children))
    try:
        applied = lachesis.step()
    finally:
        lachesis.close()
    assert set(applied) == {children[0].pid, children[2].pid}


def test_unprivileged_controller_warns_once_and_idles(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[tuple[int, int]] = []

    def refuse(which: int, pid: int, nice: int) -> None:
        calls.append((pid, nice))
        if nice < 0:
            raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "setpriority", refuse)
    samples = []

    def sample() -> list[InstanceLoad]:
        samples.append(1)
        return [load(pid=os.getpid(), queue=1), load(pid=os.getppid(), queue=9)]

    lachesis = LachesisController("qs", sample=sample, use_cgroups=False)
    with caplog.at_level(logging.WARNING):
        results = [lachesis.step() for _ in range(5)]
    lachesis.close()
    assert results == [{}] * 5
    assert not lachesis.privileged
    assert len(samples) == 1
    assert calls[0][1] == -20  # the most favoured first: refused before any was pushed down
    assert all(nice <= 0 for _, nice in calls)
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert "unprioritised" in warnings[0].getMessage()


def test_controller_validates_its_configuration() -> None:
    with pytest.raises(ValueError, match="unknown Lachesis policy"):
        LachesisController("edf", sample=list)
    with pytest.raises(ValueError, match="period_s"):
        LachesisController("qs", sample=list, period_s=0)


async def test_run_steps_every_period_until_cancelled() -> None:
    samples: list[int] = []

    def sample() -> list[InstanceLoad]:
        samples.append(1)
        return []

    lachesis = LachesisController("fcfs", sample=sample, period_s=0.001, use_cgroups=False)
    task = asyncio.create_task(lachesis.run())
    for _ in range(5000):
        if len(samples) >= 3:
            break
        await asyncio.sleep(0.001)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(samples) >= 3
