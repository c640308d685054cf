"""Errors of the data plane: batches, credits, partitioning, sequences.

::

    AgiledartError                      (agiledart.errors)
    └── DataPlaneError
        ├── DataPlaneUsageError  local misuse: bad constructor arguments, a
        │                        non-positive grant, an unpartitionable key
        ├── WouldBlock           a ``*_nowait`` call or ``consume`` cannot proceed
        │                        now (no credit, queue full); retry later
        ├── ClosedResourceError  this end was closed and then used (local misuse)
        ├── BrokenResourceError  the other end went away (remote)
        └── ProtocolError        remote misbehaviour: the peer broke the protocol,
            │                    e.g. sent more records than it had credit for
            └── FrameError       a wire frame (data, wm, bar, credit) of the wrong shape
                └── BatchDecodeError  bytes or a dict that are not a valid batch
"""

from __future__ import annotations

from agiledart.errors import AgiledartError

__all__ = [
    "BatchDecodeError",
    "BrokenResourceError",
    "ClosedResourceError",
    "DataPlaneError",
    "DataPlaneUsageError",
    "FrameError",
    "ProtocolError",
    "WouldBlock",
]


class DataPlaneError(AgiledartError):
    """Base class of the data plane's errors."""


class DataPlaneUsageError(DataPlaneError):
    """A data-plane object was driven wrongly by local code."""


class WouldBlock(DataPlaneError):
    """The operation cannot complete without waiting (trio's ``WouldBlock``)."""


class ClosedResourceError(DataPlaneError):
    """This end was closed; using it again is a local bug."""


class BrokenResourceError(DataPlaneError):
    """The other end is gone; nothing more will be received or accepted."""


class ProtocolError(DataPlaneError):
    """The remote end broke the data-plane protocol."""


class FrameError(ProtocolError):
    """A wire frame of the data plane that does not decode to its typed value."""


class BatchDecodeError(FrameError):
    """Bytes or a mapping that do not decode to a valid :class:`Batch`."""
