"""Control plane at scale: 10,000 simulated peers, 250 to 1,000 apps (paper Fig. 10).

One process, virtual time (:mod:`agiledart.largescale`): the real overlay protocol on
the fake network (routing tables and leaf sets filled from the global id list rather
than by ten thousand joins), the real zone logic (gossip walk, 50-app cap, election)
and the real placement over real JOIN paths; operators are placed, not executed. Apps
(chains, two-source unions, two-sink forks; 6 to 14 operators, 10 on average) arrive
in rounds; after each the distributions are measured.

    python scripts/bench_scale.py --json

Anchors (paper §VII-E): about 96.5% of nodes host fewer than 3 operators at 250 and 500
apps, about 99.84% fewer than 4 at 750 and 1,000; schedulers found within 4 hops
(ceil(log_16 10,000)); one scheduler per 50 apps of a zone.
"""

from __future__ import annotations

import argparse
import json
import sys

import psutil

from agiledart.largescale import ScaleConfig, simulate
from agiledart.overlay.fakenet import run_virtual


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", type=int, default=10_000)
    parser.add_argument("--zones", type=int, default=16, help="a square number is best")
    parser.add_argument(
        "--apps", default="250,500,750,1000", help="total apps after each round (comma list)"
    )
    parser.add_argument("--operators", type=int, default=10, help="mean operators per app")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--fanout", type=int, default=3, help="contacts asked per walk step")
    parser.add_argument("--app-slot-limit", type=int, default=1, help="placement slot_limit")
    parser.add_argument("--leaf-set-size", type=int, default=16, help="L of the overlay")
    parser.add_argument("--json", action="store_true", help="print one JSON object last")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args()
    config = ScaleConfig(
        peers=args.peers,
        zones=args.zones,
        rounds=tuple(int(a) for a in args.apps.split(",")),
        mean_operators=args.operators,
        seed=args.seed,
        fanout=args.fanout,
        app_slot_limit=args.app_slot_limit,
        leaf_set_size=args.leaf_set_size,
    )

    def log(msg: str) -> None:
        if not args.quiet:
            print(msg, file=sys.stderr, flush=True)

    raw = run_virtual(simulate(config, log=log))
    result: dict[str, object] = {
        "peers": raw["peers"],
        "zones": raw["zones"],
        "hop_budget": raw["hop_budget"],
        "leaf_set_size": args.leaf_set_size,
    }
    for rnd in raw["rounds"]:
        n = rnd["apps"]
        for key in (
            "operators",
            "frac_peers_lt3_ops",
            "frac_peers_lt4_ops",
            "max_ops_per_peer",
            "ops_per_peer",
            "schedulers",
            "schedulers_ideal",
            "schedulers_per_zone",
            "mean_scheduler_hops",
            "scheduler_hops",
            "elections",
            "false_elections",
            "refusals",
            "unplaced",
        ):
            result[f"{key}_{n}"] = rnd[key]
    last = raw["rounds"][-1]
    result["p99_scheduler_hops"] = last["p99_scheduler_hops"]  # over every app submitted
    result["mean_scheduler_hops"] = last["mean_scheduler_hops"]
    result["anchor_frac_lt3_ops_250_500"] = 0.9652
    result["anchor_frac_lt4_ops_750_1000"] = 0.9984
    result["anchor_scheduler_hops"] = 4
    result["build_s"] = raw["build_s"]
    result["wall_s"] = raw["wall_s"]
    result["rss_mb"] = round(psutil.Process().memory_info().rss / 2**20)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:34} {value}")


if __name__ == "__main__":
    main()
