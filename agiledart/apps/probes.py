"""Apps built to show a fault: their output changes if one record is lost or repeated.

``counting`` is the failure-recovery probe of the tests, the docker emulation and the
recovery demos: counter records -> ``filter`` (drops every 7th) -> ``map`` pinned to
``edge-2`` -> a keyed running count pinned to the peer that will be killed -> a file
sink on ``gateway-1``, the source on ``sensor-1``. Its reference output is exact, so
a restart that loses or replays input shows in the counts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["counting"]


def counting(
    host: str,
    *,
    count: int = 24_000,
    rate: int = 3_000,
    name: str = "counting",
    checkpoint: Mapping[str, Any] | None = None,
    path: str | None = None,
) -> dict[str, Any]:
    """The counting probe as a raw spec (a map, for ``parse_spec`` or a YAML file), its
    running count pinned to ``host``; the sink writes ``path`` (default ``NAME.jsonl``)."""
    return {
        "name": name,
        "checkpoint": dict(checkpoint or {"mode": "restart"}),
        "sources": [
            {
                "id": "readings",
                "peer": "sensor-1",
                "connector": "generator",
                "params": {"dataset": "counter", "rate": rate, "count": count, "keys": 32},
            }
        ],
        "operators": [
            {
                "id": "sampled",
                "op": "filter",
                "fn": "builtin:skip_every",
                "params": {"field": "seq", "n": 7},
                "inputs": ["readings"],
            },
            {
                "id": "scaled",
                "op": "map",
                "fn": "builtin:scale",
                "params": {"field": "seq", "factor": 2},
                "inputs": ["sampled"],
                "peer": "edge-2",
            },
            {
                "id": "counts",
                "op": "aggregate",
                "params": {"key": "key", "aggregate": "count"},
                "inputs": ["scaled"],
                "peer": host,
            },
        ],
        "sinks": [
            {
                "id": "out",
                "peer": "gateway-1",
                "connector": "file",
                "params": {"path": path or f"{name}.jsonl"},
                "inputs": ["counts"],
            }
        ],
    }
