"""Overlay benchmark: recursive routing over N peers on the fake network.

Builds N peers in virtual time (the real protocol code: authenticated datagrams,
kademlia lookups, leaf sets, heartbeats), runs one refresh round, routes to random keys
and to peer ids, kills 10% of the peers, waits for the failure detector, and routes
again. A route counts as delivered only if it ends at the live peer whose id is truly
closest to the key (ground truth from outside the protocol).

    python scripts/bench_overlay.py --peers 1000 --json

Anchor: log_16 N, Pastry's bound and the paper's "within 4 hops" for N = 10,000.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

import psutil

from agiledart.overlay.config import OverlayConfig
from agiledart.overlay.fakenet import run_virtual
from agiledart.overlay.simulation import RouteOutcome, SimulatedRing


def _summary(outcomes: list[RouteOutcome]) -> tuple[float, float, int]:
    delivered = [o for o in outcomes if o.delivered]
    hops = sorted(o.hops for o in delivered) or [0]
    p99 = hops[min(len(hops) - 1, math.ceil(0.99 * len(hops)) - 1)]
    return len(delivered) / len(outcomes), sum(hops) / len(hops), p99


def _log(args: argparse.Namespace, msg: str) -> None:
    if not args.quiet:
        print(msg, file=sys.stderr, flush=True)


async def run(args: argparse.Namespace) -> dict[str, object]:
    rss0 = psutil.Process().memory_info().rss
    t0 = time.perf_counter()
    config = OverlayConfig(
        heartbeat_interval_s=args.heartbeat, proximity_slack_bits=args.slack, ksize=args.ksize
    )
    wave = args.wave or max(1, args.peers // 10)  # joins spread over ten waves
    async with SimulatedRing(n=args.peers, seed=args.seed, config=config, wave=wave) as ring:
        rss_mb_per_peer = (psutil.Process().memory_info().rss - rss0) / 2**20 / args.peers
        _log(args, f"built {args.peers} peers in {time.perf_counter() - t0:.0f} s")
        await ring.stabilize()
        _log(args, f"stabilized at {time.perf_counter() - t0:.0f} s")
        to_keys = await ring.route_many(args.routes)
        to_ids = await ring.route_many(args.routes // 2, to_peer_ids=True)
        delivered, mean_hops, p99 = _summary(to_keys + to_ids)
        _log(args, f"routed: delivered {delivered:.4f}, mean hops {mean_hops:.2f}, p99 {p99}")
        victims = ring.rng.sample(ring.nodes, args.peers // 10)
        ring.kill(victims)
        # (misses_to_dead + 1) heartbeat intervals: every victim's leaf set has noticed
        await ring.settle((config.misses_to_dead + 2) * config.heartbeat_interval_s)
        after = await ring.route_many(args.routes)
        delivered_killed, mean_killed, _ = _summary(after)
        _log(
            args,
            f"after killing 10%: delivered {delivered_killed:.4f} in "
            f"{time.perf_counter() - t0:.0f} s",
        )
    return {
        "peers": args.peers,
        "routes": len(to_keys) + len(to_ids),
        "mean_hops": round(mean_hops, 3),
        "p99_hops": p99,
        "delivered_fraction": delivered,
        "delivered_fraction_10pct_killed": delivered_killed,
        "mean_hops_10pct_killed": round(mean_killed, 3),
        "anchor_log16_n": round(math.log(args.peers, 16), 3),
        "rss_mb_per_peer": round(rss_mb_per_peer, 3),
        "wall_s": round(time.perf_counter() - t0, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", type=int, default=1000)
    parser.add_argument("--routes", type=int, default=2000, help="routes to random keys")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--wave", type=int, default=0, help="peers joining at once")
    parser.add_argument("--heartbeat", type=float, default=2.0, help="heartbeat interval (s)")
    parser.add_argument(
        "--slack",
        type=int,
        default=OverlayConfig().proximity_slack_bits,
        help="prefix bits traded for proximity",
    )
    parser.add_argument("--ksize", type=int, default=OverlayConfig().ksize, help="bucket size k")
    parser.add_argument("--json", action="store_true", help="print one JSON object last")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args()
    result = run_virtual(run(args))
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:34} {value}")


if __name__ == "__main__":
    main()
