"""Exceptions of the overlay.

::

    AgiledartError
    └── OverlayError
        ├── ConfigError            local misuse: no cluster key, bad address, bad id file
        ├── RouteError             a route could not be completed (timeout, no live peer)
        ├── PeerUnreachable        a peer did not answer an RPC or a connection attempt
        ├── UnknownPeer            no peer of that name is in the ring
        ├── UnknownRequest         a peer has no handler for a request's type
        ├── RemoteError            a peer answered with an error this side does not know
        │                          (its wire name kept in ``error_type``)
        ├── FrameStateError        a frame connection used out of order (frames.py)
        └── BadMessage             remote misbehaviour: what a peer sent us is unusable
            ├── AuthError          missing or wrong HMAC, or a failed session handshake
            │   └── KeyMismatch    sealed under a cluster key that differs from ours
            ├── ReplayError        a datagram already accepted, too old, or for another peer
            ├── ClockSkewError     a timestamp outside the window: a clock is wrong
            ├── OversizeError      above the hard size limit of its decoder
            └── MalformedError     undecodable, or decodable but of the wrong shape

Every decoder turns bad input into exactly one :class:`BadMessage`; the drivers count
it, log it at a bounded rate and drop it. Nothing a remote sends can raise anything else.

A peer's error answer arrives as the class it raised there (registered with
:func:`~agiledart.errors.crosses_peers`), or as :class:`RemoteError` if unknown here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from agiledart.errors import AgiledartError, crosses_peers


@crosses_peers("OverlayError")
class OverlayError(AgiledartError):
    """Base class of overlay errors."""


@crosses_peers("ConfigError")
class ConfigError(OverlayError):
    """The overlay was configured wrongly (a local mistake)."""


@crosses_peers("RouteError")
class RouteError(OverlayError):
    """A routed message was not delivered."""


@crosses_peers("PeerUnreachable")
class PeerUnreachable(OverlayError):
    """A peer did not answer."""


@crosses_peers("UnknownPeer")
class UnknownPeer(OverlayError):
    """A command named a peer this peer has not heard of."""


@crosses_peers("UnknownRequest")
class UnknownRequest(OverlayError):
    """A peer has no handler for requests of this type (it runs without that service,
    or an older version)."""


@crosses_peers("RemoteError")
class RemoteError(OverlayError):
    """A peer answered with an error whose wire name is not known here: ``error_type``
    is that name, ``remote_message`` its message, ``peer`` who answered."""

    wire_fields: ClassVar[Mapping[str, type]] = {
        "error_type": str,
        "remote_message": str,
        "peer": str,
    }

    def __init__(self, error_type: str, remote_message: str, *, peer: str = "peer") -> None:
        super().__init__(f"{peer} answered {error_type}: {remote_message}")
        self.error_type = error_type
        self.remote_message = remote_message
        self.peer = peer


@crosses_peers("BadMessage")
class BadMessage(OverlayError):
    """A remote sent something we refuse to act upon."""

    reason = "bad"


@crosses_peers("AuthError")
class AuthError(BadMessage):
    reason = "auth"


KEY_DIFFERS = (
    "the cluster key differs from this peer's: check --cluster-key-file / AGILEDART_CLUSTER_KEY"
)


@crosses_peers("KeyMismatch")
class KeyMismatch(AuthError):
    """A message under a key that is not one of ours (by its key id): a configuration
    mistake on one side, said in words that name the fix."""

    reason = "key"

    def __init__(self, message: str = KEY_DIFFERS) -> None:
        super().__init__(message)


@crosses_peers("ReplayError")
class ReplayError(BadMessage):
    reason = "replay"


@crosses_peers("ClockSkewError")
class ClockSkewError(BadMessage):
    """A timestamp too far from our clock; ``skew_s`` is how far (positive: ahead)."""

    reason = "clock"
    wire_fields: ClassVar[Mapping[str, type]] = {"skew_s": float}

    def __init__(self, message: str, *, skew_s: float = 0.0) -> None:
        super().__init__(message)
        self.skew_s = skew_s


@crosses_peers("OversizeError")
class OversizeError(BadMessage):
    reason = "oversize"


@crosses_peers("MalformedError")
class MalformedError(BadMessage):
    reason = "malformed"
