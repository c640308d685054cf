"""Traces from the regret simulator, so ``agiledart analyze`` can read a simulation.

:func:`trace_simulation` runs :func:`agiledart.bandit.simulate` for one graph and one
policy and writes, through a :class:`~agiledart.traces.TraceWriter`, what peers would
write for the same packets:

* one ``shuffle`` record per transmission attempt: a hop that took ``a`` attempts is
  ``a - 1`` ``lost`` attempts and one ``ok``, each ``slot_ms`` long; ``tau`` is the
  packet number (the policy's time index), ``omega`` and ``j`` are null;
* one ``delivery`` record per packet: its path of node ids, attempts, delay and
  ``optimal_ms`` = D(p*), the expected delay of the optimal path, so that the regret
  curve ``analyze`` computes is the simulator's ``SimResult.regret()``.

Run it as ``python -m agiledart.analysis.simulated --graph FILE --policy NAME
--packets K --trace-dir DIR`` (docs/traces.md); it needs numpy only, not Spark.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from agiledart.analysis.errors import AnalysisUsageError
from agiledart.bandit import (
    DEFAULT_EXPLORATION,
    PAPER_SIZES,
    EndToEndLcbRouting,
    Graph,
    KlUcbRouting,
    NextHopRouting,
    OptimalRouting,
    RoutingPolicy,
    SimResult,
    load_graph,
    optimal_path,
    paper_network,
    simulate,
)
from agiledart.errors import AgiledartError
from agiledart.traces.writer import TraceWriter

__all__ = ["POLICIES", "main", "make_policy", "trace_simulation"]

APP = "regret-sim"

POLICIES: dict[str, Callable[[Graph, float], RoutingPolicy]] = {
    "agiledart": lambda g, c: KlUcbRouting(g, exploration=c),
    "agiledart-1hop": lambda g, c: KlUcbRouting(g, exploration=c, hops=1),
    "agiledart-2hop": lambda g, c: KlUcbRouting(g, exploration=c, hops=2),
    "end-to-end": lambda g, c: EndToEndLcbRouting(g),
    "next-hop": lambda g, c: NextHopRouting(g),
    "optimal": lambda g, c: OptimalRouting(g),
}


def make_policy(name: str, graph: Graph, exploration: float = DEFAULT_EXPLORATION) -> RoutingPolicy:
    try:
        factory = POLICIES[name]
    except KeyError:
        msg = f"unknown policy {name!r}; choose from {', '.join(POLICIES)}"
        raise AnalysisUsageError(msg) from None
    return factory(graph, exploration)


class _Recorder:
    """Turns the simulator's per-hop dicts into ``shuffle`` and ``delivery`` records."""

    def __init__(self, graph: Graph, writer: TraceWriter, app: str) -> None:
        self.writer = writer
        self.app = app
        self.slot_ms = graph.slot_ms
        self.origin = str(graph.node_ids[graph.source])
        self.dest = str(graph.node_ids[graph.sink])
        self.optimal_ms = optimal_path(graph)[1]
        self._path: list[str] = [self.origin]
        self._attempts = 0
        self._delay_ms = 0.0

    def __call__(self, hop: dict[str, Any]) -> None:
        k, attempts = int(hop["packet"]), int(hop["attempts"])
        common = {
            "app": self.app,
            "packet": str(k),
            "origin": self.origin,
            "dest": self.dest,
            "policy": str(hop["policy"]),
            "graph": str(hop["graph"]) or None,
        }
        for attempt in range(attempts):
            self.writer.emit(
                "shuffle",
                **common,
                hop=int(hop["hop"]),
                node=str(hop["from"]),
                next=str(hop["to"]),
                outcome="ok" if attempt == attempts - 1 else "lost",
                delay_ms=self.slot_ms,
                tau=k,
                omega=None,
                j=None,
            )
        self._path.append(str(hop["to"]))
        self._attempts += attempts
        self._delay_ms += float(hop["delay_ms"])
        if self._path[-1] == self.dest:
            self.writer.emit(
                "delivery",
                **common,
                k=k,
                path=self._path,
                attempts=self._attempts,
                delay_ms=self._delay_ms,
                optimal_ms=self.optimal_ms,
            )
            self._path, self._attempts, self._delay_ms = [self.origin], 0, 0.0


def trace_simulation(
    graph: Graph,
    policy: RoutingPolicy,
    writer: TraceWriter,
    *,
    packets: int,
    seed: int,
    app: str = APP,
) -> SimResult:
    """Simulate ``packets`` packets and write their ``shuffle`` and ``delivery`` records."""
    result = simulate(
        graph, policy, packets=packets, seed=seed, on_decision=_Recorder(graph, writer, app)
    )
    writer.flush()
    return result


def _graph(args: argparse.Namespace) -> Graph:
    if args.graph is not None:
        return load_graph(args.graph)
    return paper_network(args.paper_size, rng=np.random.default_rng(args.graph_seed))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m agiledart.analysis.simulated",
        description="Run the regret simulator and write its shuffle and delivery records "
        "as traces (one peer folder per policy) for `agiledart analyze`.",
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--graph", type=Path, help="a graph file (docs/bandit-graphs.md)")
    source.add_argument(
        "--paper-size",
        type=int,
        default=25,
        choices=[n for n, _ in PAPER_SIZES],
        help="a generated paper network of this many nodes (default 25)",
    )
    parser.add_argument("--graph-seed", type=int, default=0, help="seed of --paper-size")
    parser.add_argument(
        "--policy",
        action="append",
        choices=list(POLICIES),
        help="a policy (repeatable; default agiledart, end-to-end, next-hop)",
    )
    parser.add_argument("--packets", type=int, default=2000, help="K (default 2000)")
    parser.add_argument("--seed", type=int, default=1, help="link randomness (default 1)")
    parser.add_argument("--exploration", type=float, default=DEFAULT_EXPLORATION, help="C")
    parser.add_argument("--trace-dir", type=Path, required=True, help="where to write")
    parser.add_argument("--gzip", action="store_true", help="write .ndjson.gz files")
    args = parser.parse_args(argv)
    try:
        graph = _graph(args)
        for name in args.policy or ["agiledart", "end-to-end", "next-hop"]:
            policy = make_policy(name, graph, args.exploration)
            with TraceWriter(args.trace_dir, f"sim-{name}", compress=args.gzip) as writer:
                result = trace_simulation(
                    graph, policy, writer, packets=args.packets, seed=args.seed
                )
            print(
                f"{name}: {result.packets} packets on {graph.name or 'graph'}, "
                f"R(K) = {result.regret()[-1]:.0f} ms, {writer.written} lines"
            )
    except AgiledartError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
