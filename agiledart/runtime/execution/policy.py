"""Which operator instance gets a core: EdgeWise's dispatcher and Lachesis's policies.

Theory of operation
-------------------

Pure decisions, no I/O: queue sizes arrive through a callable or as values, randomness
is a ``random.Random`` passed in. The drivers (the worker pool, ``lachesis.py``) act.

**EdgeWise** (Fu et al., USENIX ATC 2019, §4.1-4.2). A fixed pool of K workers replaces
one thread per operator. A free worker asks for work and gets the operator with the
longest pending input queue that no other worker is running, so at most one worker
serves a queue and FIFO order holds. :class:`Dispatcher` is that decision. The
``"random"`` policy is the paper's WP+Random control (§7): a uniformly random waiting
queue. Keys with nothing pending when a decision is made are dropped from the waiting
set; ``done`` puts a key back if its queue refilled while it ran.

*Our addition: a starvation guard.* Pure longest-queue-first starves a short queue for
as long as longer ones keep refilling (sustained overload). Each waiting key counts
how often it was passed over (another key got a worker while it waited with work).
Once some key reaches ``patience``, the most passed-over key is served first (ties:
the one that has waited longest). A key is therefore dispatched within
``patience + n - 1`` decisions that pass it over, n being the number of distinct keys:
``patience`` to become the most urgent tier, then at most one decision for each key
already ahead of it (newcomers start at zero and never overtake it).

Optional affinity (``holder``): the worker that keeps a key's operator state gets the
key when it is free. Affinity only chooses among free workers, never which key runs.

**Lachesis** (Palyvos-Giannas et al., Middleware 2021, §5.1, §5.3). Every period a
policy turns per-instance metrics (:class:`InstanceLoad`) into priorities, higher
meaning more CPU:

* ``qs``: queue size, the tuples waiting (EdgeWise's goal, balanced queues).
* ``fcfs``: age of the oldest queued tuple (minimises the maximum latency).
* ``hr``: highest rate, Sharaf et al. (TODS 2008) as cited in §5.1: the global output
  rate ``GR_x = S_x / C_x``, output tuples per CPU second, where ``S_x`` is the
  selectivity and ``C_x`` the cost per input tuple from the operator to the sink. A
  load carries the operator's own ``selectivity`` and ``service_s``, so we use
  ``selectivity / service_s``; a sampler that knows the downstream path may put the
  path values there instead (``S_x = s_x * S_{x+1}``,
  ``C_x = c_x + s_x * C_{x+1}``). An instance with no cost measured yet gets the
  median of the known rates.
* ``random``: uniform priorities, the control.

Translation to nice values (§5.3, §2): nice ``n`` weighs ``1024 / 1.25**n``, 40 levels
in [-20, 19]. Linear policies use min-max normalisation: the highest priority gets
``lowest`` (-20), the lowest gets ``highest`` (19). Rate-based policies (``LOG_SCALED``)
use ``F(x) = n_max + (log p_max - log x) / log 1.25`` with ``n_max = lowest``, so a
priority ratio becomes the same CPU-weight ratio; when the range does not fit, a
min-max normalisation of those values follows (a priority of 0 or less gets
``highest``). Equal priorities all get nice 0.

Translation to cgroups: the same scale, before rounding to 40 levels, gives a cgroup
v2 ``cpu.weight`` of ``100 * 1.25**-n`` (100 is the default and nice 0), so one
instance per cgroup is scheduled like the nice translator but with finer steps, the
reason §6.4 uses cpu.shares for more operators than nice has levels.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Generic, TypeVar

__all__ = [
    "DISPATCH_POLICIES",
    "LACHESIS_POLICIES",
    "LOG_SCALED",
    "Dispatcher",
    "InstanceLoad",
    "cgroup_weights",
    "highest_rate",
    "nice_values",
    "priorities",
]

K = TypeVar("K", bound=Hashable)

DISPATCH_POLICIES = ("edgewise", "random")
LACHESIS_POLICIES = ("qs", "fcfs", "hr", "random")
LOG_SCALED = frozenset({"hr"})
NICE_RATIO = 1.25
NICE_LOWEST, NICE_HIGHEST = -20, 19
WEIGHT_DEFAULT, WEIGHT_MIN, WEIGHT_MAX = 100, 1, 10_000


class Dispatcher(Generic[K]):
    """Assign waiting queues (keys) to a fixed pool of ``workers`` (EdgeWise §4.1).

    ``want(key)`` for a key already waiting or running is a no-op: a running key is
    put back by ``done`` when ``pending(key)`` is still positive then.
    """

    def __init__(
        self,
        workers: int,
        policy: str,
        *,
        pending: Callable[[K], int],
        rng: random.Random,
        patience: int = 8,
        holder: Callable[[K], int | None] | None = None,
    ) -> None:
        if workers < 1:
            msg = f"a dispatcher needs at least one worker, got {workers}"
            raise ValueError(msg)
        if policy not in DISPATCH_POLICIES:
            msg = f"unknown dispatch policy {policy!r}; use one of {', '.join(DISPATCH_POLICIES)}"
            raise ValueError(msg)
        if patience < 1:
            msg = f"patience must be at least 1, got {patience}"
            raise ValueError(msg)
        self._policy = policy
        self._pending = pending
        self._rng = rng
        self._patience = patience
        self._holder = holder
        self._free = set(range(workers))
        self._running: dict[int, K] = {}
        self._worker_of: dict[K, int] = {}
        self._waiting: dict[K, int] = {}  # key -> times passed over; order = arrival
        self._cancelled: set[K] = set()  # running keys that done() must not put back

    @property
    def running(self) -> Mapping[int, K]:
        return MappingProxyType(self._running)

    @property
    def waiting(self) -> Collection[K]:
        return tuple(self._waiting)

    @property
    def free(self) -> int:
        return len(self._free)

    def want(self, key: K) -> None:
        """The queue of ``key`` has work and asks for a worker."""
        if key in self._worker_of:
            self._cancelled.discard(key)
        else:
            self._waiting.setdefault(key, 0)

    def cancel(self, key: K) -> None:
        """The queue goes away; a running key keeps its worker until ``done``."""
        self._waiting.pop(key, None)
        if key in self._worker_of:
            self._cancelled.add(key)

    def done(self, worker: int) -> K:
        """``worker`` finished its turn; returns the key it ran."""
        if worker not in self._running:
            msg = f"worker {worker} is not running any queue"
            raise ValueError(msg)
        key = self._running.pop(worker)
        del self._worker_of[key]
        self._free.add(worker)
        if key in self._cancelled:
            self._cancelled.discard(key)
        elif self._pending(key) > 0:
            self._waiting[key] = 0
        return key

    def dispatch(self) -> list[tuple[int, K]]:
        """Give every free worker a waiting queue with work; ``(worker, key)`` pairs."""
        if not self._free or not self._waiting:
            return []
        sizes: dict[K, int] = {}
        for key in list(self._waiting):
            size = self._pending(key)
            if size > 0:
                sizes[key] = size
            else:
                del self._waiting[key]
        assigned: list[tuple[int, K]] = []
        while self._free and sizes:
            key = self._choose(sizes)
            del sizes[key]
            del self._waiting[key]
            for other in sizes:
                self._waiting[other] += 1
            worker = self._worker_for(key)
            self._free.discard(worker)
            self._running[worker] = key
            self._worker_of[key] = worker
            assigned.append((worker, key))
        return assigned

    def _choose(self, sizes: Mapping[K, int]) -> K:
        passed = self._waiting
        candidates = list(sizes)  # arrival order: max() keeps the first of equals
        most_passed = max(candidates, key=passed.__getitem__)
        if passed[most_passed] >= self._patience:
            return most_passed
        if self._policy == "random":
            return self._rng.choice(candidates)
        return max(candidates, key=lambda key: (sizes[key], passed[key]))

    def _worker_for(self, key: K) -> int:
        held_by = self._holder(key) if self._holder is not None else None
        if held_by is not None and held_by in self._free:
            return held_by
        return min(self._free)


@dataclass(frozen=True, slots=True)
class InstanceLoad:
    """What Lachesis's policies see of one operator instance process in one period."""

    pid: int
    queue: int  # tuples waiting
    oldest_s: float | None  # age of the oldest queued tuple; None when empty
    rate: float  # input tuples per second
    service_s: float | None  # CPU seconds per input tuple; None until measured
    selectivity: float = 1.0  # output tuples per input tuple


def highest_rate(load: InstanceLoad) -> float | None:
    """Sharaf et al.'s output rate ``S / C`` (tuples out per CPU second), or None."""
    if load.service_s is None or load.service_s <= 0:
        return None
    return load.selectivity / load.service_s


def priorities(policy: str, loads: Sequence[InstanceLoad], *, rng: random.Random) -> list[float]:
    """One priority per load, higher meaning more CPU (Lachesis §5.1)."""
    if policy == "qs":
        return [float(load.queue) for load in loads]
    if policy == "fcfs":
        return [load.oldest_s or 0.0 for load in loads]
    if policy == "hr":
        rates = [highest_rate(load) for load in loads]
        known = [rate for rate in rates if rate is not None]
        fill = statistics.median(known) if known else 1.0
        return [fill if rate is None else rate for rate in rates]
    if policy == "random":
        return [rng.random() for _ in loads]
    msg = f"unknown Lachesis policy {policy!r}; use one of {', '.join(LACHESIS_POLICIES)}"
    raise ValueError(msg)


def _nice_scale(prios: Sequence[float], log_scale: bool, lowest: int, highest: int) -> list[float]:
    """Unrounded nice values (Lachesis §5.3); see the module docstring."""
    if lowest >= highest:
        msg = f"lowest nice {lowest} must be below highest {highest}"
        raise ValueError(msg)
    if not all(math.isfinite(p) for p in prios):
        msg = f"priorities must be finite numbers, got {list(prios)}"
        raise ValueError(msg)
    if not prios or max(prios) == min(prios):
        return [0.0] * len(prios)
    top, bottom, span = max(prios), min(prios), highest - lowest
    if not (log_scale and top > 0):
        return [highest - (p - bottom) * span / (top - bottom) for p in prios]
    scaled = [lowest + math.log(top / p, NICE_RATIO) if p > 0 else math.inf for p in prios]
    worst = max(n for n in scaled if n != math.inf)
    if worst > highest:
        scaled = [lowest + (n - lowest) * span / (worst - lowest) for n in scaled]
    return [min(n, highest) for n in scaled]


def nice_values(
    prios: Sequence[float],
    *,
    log_scale: bool = False,
    lowest: int = NICE_LOWEST,
    highest: int = NICE_HIGHEST,
) -> list[int]:
    """Nice values for priorities: the highest priority gets ``lowest``."""
    scale = _nice_scale(prios, log_scale, lowest, highest)
    return [max(lowest, min(highest, round(n))) for n in scale]


def cgroup_weights(prios: Sequence[float], *, log_scale: bool = False) -> list[int]:
    """cgroup v2 ``cpu.weight`` values in [1, 10000]; equal priorities get 100."""
    scale = _nice_scale(prios, log_scale, NICE_LOWEST, NICE_HIGHEST)
    return [max(WEIGHT_MIN, min(WEIGHT_MAX, round(WEIGHT_DEFAULT * NICE_RATIO**-n))) for n in scale]
