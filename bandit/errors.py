"""Exceptions of :mod:`agiledart.bandit`.

::

    AgiledartError
    └── BanditError                  anything this package raises on purpose
        ├── GraphError               a graph (file or in memory) is invalid; names the field
        ├── NoRouteError             no loop-free way on toward the sink from here
        ├── BanditUsageError         local misuse: bad parameter, unknown link or neighbour
        └── AdvertisementError       remote misbehaviour: a neighbour advertised a bad J

Local misuse (our own caller got it wrong) and remote misbehaviour (a peer sent a
value that cannot be right) are separate types, so a relay can log and drop the second
while the first stays a bug.
"""

from __future__ import annotations

from agiledart.errors import AgiledartError


class BanditError(AgiledartError):
    """Base class of every error :mod:`agiledart.bandit` raises on purpose."""


class GraphError(BanditError):
    """A graph is invalid. ``field`` names the offending field, e.g. ``links[3].theta``."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")


class NoRouteError(BanditError):
    """No neighbour leads on to the sink without revisiting a node of the packet's path."""


class BanditUsageError(BanditError):
    """The caller misused the API: a parameter out of range, an unknown link or neighbour."""


class AdvertisementError(BanditError):
    """A neighbour advertised a cost-to-go that cannot be right (negative, NaN)."""
