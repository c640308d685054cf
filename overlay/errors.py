"""Exceptions of the overlay.

::

    AgiledartError
    └── OverlayError
        ├── ConfigError            local misuse: no cluster key, bad address, bad id file
        ├── RouteError             a route could not be completed (timeout, no live peer)
        ├── PeerUnreachable        a peer did not answer an RPC or a connection attempt
        ├── RemoteError            a peer answered a frame request with an error (tcp.py)
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
"""

from __future__ import annotations

from agiledart.errors import AgiledartError


class OverlayError(AgiledartError):
    """Base class of overlay errors."""


class ConfigError(OverlayError):
    """The overlay was configured wrongly (a local mistake)."""


class RouteError(OverlayError):
    """A routed message was not delivered."""


class PeerUnreachable(OverlayError):
    """A peer did not answer."""


class BadMessage(OverlayError):
    """A remote sent something we refuse to act upon."""

    reason = "bad"


class AuthError(BadMessage):
    reason = "auth"


KEY_DIFFERS = (
    "the cluster key differs from this peer's: check --cluster-key-file / AGILEDART_CLUSTER_KEY"
)


class KeyMismatch(AuthError):
    """A message under a key that is not one of ours (by its key id): a configuration
    mistake on one side, said in words that name the fix."""

    reason = "key"

    def __init__(self, message: str = KEY_DIFFERS) -> None:
        super().__init__(message)


class ReplayError(BadMessage):
    reason = "replay"


class ClockSkewError(BadMessage):
    """A timestamp too far from our clock; ``skew_s`` is how far (positive: ahead)."""

    reason = "clock"

    def __init__(self, message: str, *, skew_s: float = 0.0) -> None:
        super().__init__(message)
        self.skew_s = skew_s


class OversizeError(BadMessage):
    reason = "oversize"


class MalformedError(BadMessage):
    reason = "malformed"
