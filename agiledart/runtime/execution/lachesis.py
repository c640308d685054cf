"""Lachesis's controller: steer the OS scheduler with nice values and cgroup CPU weights.

Theory of operation
-------------------

Lachesis (Palyvos-Giannas et al., Middleware 2021, §4 Algorithm 1) runs beside the
engine: every period (1 s in the paper) it reads metrics, a policy computes one
priority per operator instance, and a translator applies them through the OS
(§5.3). The decisions are the pure functions of :mod:`.policy`; this module is the
thin driver that samples, calls them and touches the OS.

* Nice: ``os.setpriority`` on every thread of each instance process (Linux nice is per
  thread; ``PRIO_PROCESS`` with a pid moves only the main one). The most favoured
  instances are reniced first, so without the privilege to lower a nice value the
  very first call fails before any other instance was pushed down. Then one warning
  says the instances run unprioritised, what was changed is restored (best effort) and
  the controller does nothing more.
* cgroups (§2, §5.3, §6.4): each instance gets its own child cgroup under one cgroup
  made for this controller, inside the controller's own cgroup of the hierarchy with
  the ``cpu`` controller: cgroup v2 ``cpu.weight``, or cgroup v1 ``cpu.shares``
  (``weight * 1024 / 100``). Anything failing there logs once and leaves nice only.
* ``close()`` puts the instances back in their original cgroups, removes the cgroups
  made here and restores the nice values found before the first change.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from agiledart.runtime.execution.policy import (
    LACHESIS_POLICIES,
    LOG_SCALED,
    InstanceLoad,
    cgroup_weights,
    nice_values,
    priorities,
)

__all__ = ["CpuHierarchy", "LachesisController", "cgroup_dir", "cpu_hierarchies", "current_nice"]

SHARES_MIN, SHARES_MAX = 2, 262_144


def current_nice(pid: int) -> int:
    """The nice value of process ``pid`` (its main thread)."""
    return os.getpriority(os.PRIO_PROCESS, pid)


def _threads(pid: int) -> list[int]:
    try:
        return sorted(int(tid) for tid in os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return [pid]


def _renice(pid: int, nice: int) -> None:
    """Every thread of ``pid``; ProcessLookupError only when ``pid`` itself is gone."""
    for tid in _threads(pid):
        try:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
        except ProcessLookupError:
            if tid == pid:
                raise


@dataclass(frozen=True, slots=True)
class CpuHierarchy:
    """A mounted cgroup hierarchy that may carry the ``cpu`` controller."""

    version: str  # "v2" or "v1"
    mount: str  # where it is mounted
    root: str  # the hierarchy path seen at the mount point


def cpu_hierarchies(mountinfo: str) -> list[CpuHierarchy]:
    """Candidates from ``/proc/self/mountinfo``: cgroup2 first, then v1 with ``cpu``."""
    found: list[CpuHierarchy] = []
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3:
            continue
        if tail[0] == "cgroup2":
            found.insert(0, CpuHierarchy("v2", fields[4], fields[3]))
        elif tail[0] == "cgroup" and "cpu" in tail[2].split(","):
            found.append(CpuHierarchy("v1", fields[4], fields[3]))
    return found


def cgroup_dir(hierarchy: CpuHierarchy, proc_cgroup: str) -> Path | None:
    """The directory of a process's cgroup, from its ``/proc/<pid>/cgroup``."""
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        number, controllers, path = parts
        v2 = number == "0" and not controllers
        if v2 == (hierarchy.version == "v2") and (v2 or "cpu" in controllers.split(",")):
            if hierarchy.root != "/" and path.startswith(hierarchy.root):
                path = path[len(hierarchy.root) :]
            return Path(hierarchy.mount, path.lstrip("/"))
    return None


def _proc_cgroup(pid: int | str) -> str:
    try:
        return Path(f"/proc/{pid}/cgroup").read_text()
    except FileNotFoundError:
        raise ProcessLookupError(pid) from None


class _CpuGroups:
    """One child cgroup per instance under a cgroup made for one controller."""

    def __init__(self, hierarchy: CpuHierarchy, base: Path) -> None:
        self.hierarchy = hierarchy
        self._base = base
        self._homes: dict[int, Path] = {}  # pid -> the cgroup it came from

    @classmethod
    def open(cls, name: str) -> _CpuGroups:
        problems = []
        for hierarchy in cpu_hierarchies(Path("/proc/self/mountinfo").read_text()):
            own = cgroup_dir(hierarchy, _proc_cgroup("self"))
            if own is None:
                continue
            base = own / name
            try:
                base.mkdir(exist_ok=True)
                if hierarchy.version == "v2":
                    if "cpu" not in (base / "cgroup.controllers").read_text().split():
                        msg = "cpu controller not enabled for this cgroup"
                        raise OSError(msg)
                    (base / "cgroup.subtree_control").write_text("+cpu")
            except OSError as exc:
                with contextlib.suppress(OSError):
                    base.rmdir()
                problems.append(f"{hierarchy.version} at {base}: {exc}")
            else:
                return cls(hierarchy, base)
        msg = "; ".join(problems) or "no cgroup hierarchy with the cpu controller"
        raise OSError(msg)

    def place(self, pid: int, weight: int) -> None:
        """Set ``pid``'s CPU weight, moving it into its own cgroup the first time."""
        group = self._base / f"pid-{pid}"
        group.mkdir(exist_ok=True)
        if self.hierarchy.version == "v2":
            (group / "cpu.weight").write_text(str(weight))
        else:
            shares = max(SHARES_MIN, min(SHARES_MAX, round(weight * 1024 / 100)))
            (group / "cpu.shares").write_text(str(shares))
        if pid not in self._homes:
            home = cgroup_dir(self.hierarchy, _proc_cgroup(pid))
            if home is None:
                msg = f"process {pid} has no cgroup in the {self.hierarchy.version} hierarchy"
                raise OSError(msg)
            (group / "cgroup.procs").write_text(str(pid))
            self._homes[pid] = home

    def forget(self, pid: int) -> None:
        self._homes.pop(pid, None)
        with contextlib.suppress(OSError):
            (self._base / f"pid-{pid}").rmdir()

    def close(self) -> None:
        for pid, home in self._homes.items():
            with contextlib.suppress(OSError):
                (home / "cgroup.procs").write_text(str(pid))
        for group in self._groups():
            with contextlib.suppress(OSError):
                group.rmdir()
        with contextlib.suppress(OSError):
            self._base.rmdir()
        self._homes.clear()

    def _groups(self) -> Iterator[Path]:
        with contextlib.suppress(OSError):
            yield from (p for p in self._base.iterdir() if p.is_dir())


class LachesisController:
    """Applies a Lachesis policy to operator instance processes every ``period_s``."""

    def __init__(
        self,
        policy: str,
        *,
        sample: Callable[[], Sequence[InstanceLoad]],
        period_s: float = 1.0,
        rng: random.Random | None = None,
        use_cgroups: bool = True,
        log: logging.Logger | None = None,
    ) -> None:
        if policy not in LACHESIS_POLICIES:
            msg = f"unknown Lachesis policy {policy!r}; use one of {', '.join(LACHESIS_POLICIES)}"
            raise ValueError(msg)
        if period_s <= 0:
            msg = f"period_s must be positive, got {period_s}"
            raise ValueError(msg)
        self._policy = policy
        self._sample = sample
        self._period_s = period_s
        self._rng = rng if rng is not None else random.Random()
        self._use_cgroups = use_cgroups
        self._log = log if log is not None else logging.getLogger(__name__)
        self._privileged = True
        self._original: dict[int, int] = {}  # pid -> nice before our first change
        self._groups: _CpuGroups | None = None

    @property
    def privileged(self) -> bool:
        """False once lowering a nice value was refused; the controller is idle then."""
        return self._privileged

    @property
    def cgroup_version(self) -> str | None:
        """``"v2"`` or ``"v1"`` while CPU weights go through cgroups, else None."""
        return self._groups.hierarchy.version if self._groups is not None else None

    def step(self) -> dict[int, int]:
        """One period: sample, prioritise, apply; returns pid -> nice applied."""
        if not self._privileged:
            return {}
        loads = list(self._sample())
        log_scale = self._policy in LOG_SCALED
        prios = priorities(self._policy, loads, rng=self._rng)
        applied: dict[int, int] = {}
        ranked = sorted(
            zip(loads, nice_values(prios, log_scale=log_scale), strict=True),
            key=lambda pair: pair[1],
        )
        for load, nice in ranked:
            try:
                if load.pid not in self._original:
                    self._original[load.pid] = current_nice(load.pid)
                _renice(load.pid, nice)
            except ProcessLookupError:
                self._forget(load.pid)
                continue
            except PermissionError as exc:
                self._unprivileged(exc)
                return {}
            applied[load.pid] = nice
        if applied:
            self._weigh(loads, cgroup_weights(prios, log_scale=log_scale), applied)
        return applied

    async def run(self) -> None:
        """Step every ``period_s`` until cancelled."""
        while True:
            self.step()
            await asyncio.sleep(self._period_s)

    def close(self) -> None:
        """Restore cgroups and nice values of the instances still alive (best effort)."""
        if self._groups is not None:
            self._groups.close()
            self._groups = None
        for pid, nice in self._original.items():
            with contextlib.suppress(OSError):
                _renice(pid, nice)
        self._original.clear()

    def _weigh(
        self, loads: Sequence[InstanceLoad], weights: list[int], applied: dict[int, int]
    ) -> None:
        groups = self._cpu_groups()
        if groups is None:
            return
        try:
            for load, weight in zip(loads, weights, strict=True):
                if load.pid in applied:
                    with contextlib.suppress(ProcessLookupError):
                        groups.place(load.pid, weight)
        except OSError as exc:
            self._log.warning("cgroup CPU weights failed (%s); using nice values only", exc)
            groups.close()
            self._groups = None
            self._use_cgroups = False

    def _cpu_groups(self) -> _CpuGroups | None:
        if self._groups is None and self._use_cgroups:
            try:
                self._groups = _CpuGroups.open(f"agiledart-lachesis-{os.getpid()}-{id(self):x}")
            except OSError as exc:
                self._log.info("no cgroup CPU control (%s); using nice values only", exc)
                self._use_cgroups = False
        return self._groups

    def _forget(self, pid: int) -> None:
        self._original.pop(pid, None)
        if self._groups is not None:
            self._groups.forget(pid)

    def _unprivileged(self, exc: PermissionError) -> None:
        self._log.warning(
            "Lachesis may not raise the priority of operator instances (%s); "
            "they run unprioritised",
            exc,
        )
        self._privileged = False
        self.close()
