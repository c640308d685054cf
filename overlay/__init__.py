"""agiledart.overlay: the DHT ring every peer joins.

Built on the ``kademlia`` library (its routing table and iterative lookups), extended
with recursive key-based routing that records its path, a leaf set watched by a
heartbeat failure detector, authenticated datagrams and TCP frames, and a fake network
on a virtual clock for many-peer tests. Nothing outside this package imports
``kademlia`` or ``rpcudp``.
"""

from .auth import ClusterKey, load_cluster_key
from .config import OverlayConfig
from .envelope import Hop, RouteResult
from .errors import (
    AuthError,
    BadMessage,
    ClockSkewError,
    ConfigError,
    KeyMismatch,
    MalformedError,
    OverlayError,
    OversizeError,
    PeerUnreachable,
    RemoteError,
    ReplayError,
    RouteError,
    UnknownPeer,
    UnknownRequest,
)
from .leafset import Membership, MembershipEvent
from .node import Delivery, OverlayNode

__all__ = [
    "AuthError",
    "BadMessage",
    "ClockSkewError",
    "ClusterKey",
    "ConfigError",
    "Delivery",
    "Hop",
    "KeyMismatch",
    "MalformedError",
    "Membership",
    "MembershipEvent",
    "OverlayConfig",
    "OverlayError",
    "OverlayNode",
    "OversizeError",
    "PeerUnreachable",
    "RemoteError",
    "ReplayError",
    "RouteError",
    "RouteResult",
    "UnknownPeer",
    "UnknownRequest",
    "load_cluster_key",
]
