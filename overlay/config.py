"""Overlay settings, keyword-only, with the defaults a real deployment wants."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["OverlayConfig"]


@dataclass(frozen=True, kw_only=True, slots=True)
class OverlayConfig:
    ksize: int = 20  #: kademlia's k: contacts per bucket
    alpha: int = 3  #: parallelism of iterative lookups (bootstrap, refresh)
    leaf_set_size: int = 8  #: L, the closest peers watched by heartbeats
    heartbeat_interval_s: float = 1.0
    misses_to_dead: int = 3  #: consecutive missed heartbeats before a peer is dead
    rpc_timeout_s: float = 1.0
    route_hop_timeout_s: float = 0.5  #: wait for a next hop's ack before trying another
    route_timeout_s: float = 10.0  #: the origin's wait for a delivery report
    route_attempts: int = 6  #: forwarding attempts per peer before delivering locally
    max_hops: int = 32
    proximity_slack_bits: int = 0  #: prefix bits traded for lower RTT / spare capacity
    contact_max_failures: int = 3  #: consecutive failures before a contact is dropped
    refresh_interval_s: float = 60.0
    graveyard_size: int = 256  #: recently dead peers remembered for reconnection
    graveyard_ttl_s: float = 3600.0
    graveyard_probe_interval_s: float = 2.0
    graveyard_probes: int = 4  #: dead peers probed per interval (heals partitions)
    log_interval_s: float = 10.0  #: at most one log line per kind of rejection per interval

    def __post_init__(self) -> None:
        if self.ksize < 1 or self.alpha < 1 or self.leaf_set_size < 1:
            msg = "ksize, alpha and leaf_set_size must be positive"
            raise ValueError(msg)
        if self.misses_to_dead < 2:
            msg = "misses_to_dead must be at least 2"
            raise ValueError(msg)
