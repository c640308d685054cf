"""How a peer runs operators: the ``--scheduler``, ``--workers``, ``--turn`` and
``--lachesis-policy`` options (kept free of heavy imports: the CLI reads it)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LACHESIS_POLICIES", "SCHEDULERS", "EngineConfig"]

SCHEDULERS = ("edgewise", "random", "os", "lachesis")
LACHESIS_POLICIES = ("qs", "fcfs", "hr")


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    scheduler: str = "edgewise"  #: edgewise | random | os | lachesis
    workers: int = 2  #: worker processes of the pool; 0 runs operators in the peer loop
    turn: int = 50  #: tuples per turn, at most (EdgeWise's at-most-N)
    policy: str = "qs"  #: Lachesis policy: qs | fcfs | hr
    period_s: float = 1.0  #: Lachesis control period
    #: an operator stays in the peer's loop while its records cost less than this
    #: (measured); 0 sends every operator to the workers
    offload_us: float = 10.0

    def __post_init__(self) -> None:
        if self.scheduler not in SCHEDULERS:
            msg = f"scheduler must be one of {', '.join(SCHEDULERS)}, got {self.scheduler!r}"
            raise ValueError(msg)
        if self.policy not in LACHESIS_POLICIES:
            msg = f"Lachesis policy must be one of {', '.join(LACHESIS_POLICIES)}"
            raise ValueError(msg)
        if self.workers < 0 or self.turn < 1 or self.period_s <= 0 or self.offload_us < 0:
            msg = "workers and offload_us must be >= 0, turn >= 1 and the period > 0"
            raise ValueError(msg)

    @property
    def name(self) -> str:
        if self.workers == 0:
            return "inline"
        return f"lachesis-{self.policy}" if self.scheduler == "lachesis" else self.scheduler
