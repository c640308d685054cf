"""Hundreds of peers on the seeded fake network, in virtual time, through the real
protocol code (authenticated datagrams, lookups, leaf sets, heartbeats)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from agiledart.overlay.config import OverlayConfig
from agiledart.overlay.fakenet import run_virtual
from agiledart.overlay.leafset import Membership, MembershipEvent
from agiledart.overlay.simulation import RouteOutcome, SimulatedRing

N = 500


def check_paths(ring: SimulatedRing, outcomes: list[RouteOutcome]) -> None:
    """Every route ends at the true closest live peer, along a path whose XOR distance
    to the key falls at every hop, with a plausible record of each hop."""
    live = {n.node_id: n for n in ring.live()}
    for o in outcomes:
        assert o.delivered, f"route to {o.key:040x} ended at the wrong peer or not at all"
        assert o.result is not None
        path = o.result.path
        distances = [h.node_id ^ o.key for h in path]
        assert distances == sorted(distances, reverse=True)
        assert len(set(distances)) == len(distances)
        for hop in path:
            node = live[hop.node_id]
            assert (hop.host, hop.port) == node.address
            assert hop.name == node.name
        assert all(h.rtt_ms is not None and h.rtt_ms > 0 for h in path[1:])


async def settle_until(
    ring: SimulatedRing, done: Callable[[], bool], *, within: float, step: float = 0.5
) -> None:
    """Let virtual time pass in steps until ``done()``, ``within`` seconds at most (the
    asserts that follow say what is missing when it never is)."""
    deadline = asyncio.get_running_loop().time() + within
    while not done() and asyncio.get_running_loop().time() < deadline:
        await ring.settle(step)


def exact_leaf_sets(ring: SimulatedRing) -> bool:
    """Every live peer's leaf set holds exactly the live peers closest to it."""
    live = [n.node_id for n in ring.live()]
    for node in ring.live():
        size = node.config.leaf_set_size
        closest = sorted((i for i in live if i != node.node_id), key=lambda i: i ^ node.node_id)
        if node.leaf_set.ids() != set(closest[:size]):
            return False
    return True


def test_routes_to_random_keys_and_peer_ids_arrive_with_their_path() -> None:
    async def main() -> None:
        async with SimulatedRing(n=N, seed=11) as ring:
            await ring.stabilize()
            outcomes = await ring.route_many(300)
            outcomes += await ring.route_many(200, to_peer_ids=True)
            check_paths(ring, outcomes)
            to_ids = outcomes[300:]
            # routing to a live peer's own id ends at that very peer
            assert all(o.result and o.result.destination.node_id == o.key for o in to_ids)
            mean_hops = sum(o.hops for o in outcomes) / len(outcomes)
            assert mean_hops < 4

    run_virtual(main())


def test_routes_arrive_after_ten_percent_of_peers_die() -> None:
    config = OverlayConfig(heartbeat_interval_s=1.0, misses_to_dead=3)

    async def main() -> None:
        async with SimulatedRing(n=N, seed=12, config=config) as ring:
            await ring.stabilize()
            events: list[MembershipEvent] = []
            for node in ring.nodes:
                node.subscribe(events.append)
            victims = ring.rng.sample(ring.nodes, N // 10)
            ring.kill(victims)
            dead_ids = {v.node_id for v in victims}

            def noticed() -> bool:
                return not any(node.leaf_set.ids() & dead_ids for node in ring.live())

            await settle_until(ring, noticed, within=6 * config.heartbeat_interval_s)
            # the leaf sets noticed: no live peer keeps a dead one as a neighbour
            for node in ring.live():
                assert not (node.leaf_set.ids() & dead_ids)
            reported = {e.contact.node_id for e in events if e.kind is Membership.DEAD}
            assert reported <= dead_ids
            assert len(reported) >= 0.9 * len(dead_ids)
            outcomes = await ring.route_many(300)
            check_paths(ring, outcomes)
            assert all(
                not (set(h.node_id for h in o.result.path) & dead_ids) for o in outcomes if o.result
            )

    run_virtual(main())


def test_one_dead_next_hop_never_loses_a_route() -> None:
    """Kill peers without giving the detector time: routes fail over hop by hop."""

    async def main() -> None:
        async with SimulatedRing(n=300, seed=13) as ring:
            await ring.stabilize()
            ring.kill(ring.rng.sample(ring.nodes, 15))
            outcomes = await ring.route_many(200)
            check_paths(ring, outcomes)
            assert sum(n.stats["route_hop_failures"] for n in ring.live()) > 0

    run_virtual(main())


def test_a_partition_heals() -> None:
    config = OverlayConfig(heartbeat_interval_s=1.0, graveyard_probe_interval_s=1.0)

    async def main() -> None:
        async with SimulatedRing(n=300, seed=14, config=config) as ring:
            await ring.stabilize()
            half = len(ring.nodes) // 2
            side_a = [n.address for n in ring.nodes[:half]]
            side_b = [n.address for n in ring.nodes[half:]]
            ring.net.partition([side_a, side_b])
            a_ids = {n.node_id for n in ring.nodes[:half]}

            def crossing() -> int:
                return sum(1 for n in ring.nodes[half:] for m in n.leaf_set.ids() if m in a_ids)

            await settle_until(ring, lambda: crossing() == 0, within=8)
            assert crossing() == 0  # each side has given up on the other
            ring.net.heal()
            # the graveyard probes find the other side again (within a few seconds)
            await settle_until(ring, lambda: exact_leaf_sets(ring), within=30, step=1.0)
            assert exact_leaf_sets(ring)
            await ring.stabilize()
            outcomes = await ring.route_many(300)
            check_paths(ring, outcomes)

    run_virtual(main())


def test_a_peer_cut_off_alone_remembers_who_it_saw_die() -> None:
    """The witnesses a runtime asks before acting on a death (is it me who is cut
    off?): once a lone peer has lost its whole leaf set and routing table, the peers
    it declared dead in the last minute are still known."""
    config = OverlayConfig(heartbeat_interval_s=1.0, graveyard_probe_interval_s=60.0)

    async def main() -> None:
        async with SimulatedRing(n=8, seed=17, config=config) as ring:
            await ring.stabilize()
            alone, rest = ring.nodes[0], ring.nodes[1:]
            ring.net.partition([[alone.address], [n.address for n in rest]])
            await ring.settle(8)
            assert alone.leaf_set.members() == []
            assert alone.known_peers() == []
            dead = {c.node_id for c in alone.recently_dead(60.0)}
            assert dead == {n.node_id for n in rest}
            await ring.settle(10)
            assert alone.recently_dead(5.0) == []

    run_virtual(main())


def test_routes_survive_a_lossy_duplicating_network() -> None:
    async def main() -> None:
        async with SimulatedRing(n=200, seed=15, loss=0.02, duplicate=0.02) as ring:
            await ring.stabilize()
            await ring.settle(3)
            outcomes = await ring.route_many(200)
            assert sum(o.delivered for o in outcomes) == len(outcomes)
            assert asyncio.get_running_loop().time() > 0

    run_virtual(main())


def test_same_seed_same_run() -> None:
    async def once() -> list[tuple[int, int]]:
        async with SimulatedRing(n=80, seed=16) as ring:
            outcomes = await ring.route_many(50)
            return [(o.key, o.hops) for o in outcomes]

    assert run_virtual(once()) == run_virtual(once())
