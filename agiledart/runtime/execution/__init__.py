"""Operator execution inside a peer: worker pool, schedulers, per-instance processes.

The engines are in :mod:`agiledart.runtime.execution.engines` (theory of operation
there); this package exports only the light configuration.
"""

from agiledart.runtime.execution.config import LACHESIS_POLICIES, SCHEDULERS, EngineConfig

__all__ = ["LACHESIS_POLICIES", "SCHEDULERS", "EngineConfig"]
