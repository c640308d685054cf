"""Errors of a peer's application runtime (all under :class:`~agiledart.app.errors.AppError`).

::

    AppError
    ├── UnknownApp      no app with that id (in the records store)
    ├── CodeError       a code id that is not registered, or a module that does not load;
    │                   ``code_id`` names the bundle when one is to blame
    ├── StoreError      the records store could not read or write a record
    ├── DeployError     an app could not be placed or deployed (nothing is left running);
    │                   ``no_capacity`` when every usable peer was full
    ├── BrokerError     an MQTT broker cannot be reached now, or refused a request (remote)
    ├── MasterUnknown   the central master named by ``--master`` cannot be found or reached
    ├── MasterBusy      the central master's queue is full
    ├── CheckpointError a checkpoint could not be saved or loaded (which holder, said)
    ├── StoreFull       a peer's fragment store is at its bound (recovery.py)
    └── ExecutionError
        └── PeerLost    an instance could not reach a peer of its app (it may have died)

Every class here crosses peers with its own type (see :mod:`agiledart.errors`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from agiledart.app.errors import AppError, ExecutionError
from agiledart.errors import crosses_peers

__all__ = [
    "BrokerError",
    "CheckpointError",
    "CodeError",
    "DeployError",
    "MasterBusy",
    "MasterUnknown",
    "PeerLost",
    "StoreError",
    "StoreFull",
    "UnknownApp",
]


@crosses_peers("UnknownApp")
class UnknownApp(AppError):
    """No app with that id."""


@crosses_peers("CodeError")
class CodeError(AppError):
    """Registered code that is missing, corrupt, or does not define what is asked;
    ``code_id`` is the bundle's id when the error is about one bundle, else ""."""

    wire_fields: ClassVar[Mapping[str, type]] = {"code_id": str}

    def __init__(self, message: str, *, code_id: str = "") -> None:
        super().__init__(message)
        self.code_id = code_id


@crosses_peers("StoreError")
class StoreError(AppError):
    """A record could not be stored or fetched."""


@crosses_peers("DeployError")
class DeployError(AppError):
    """Placement or deployment failed; every instance already deployed was torn down.
    ``no_capacity``: placement found every peer it could use full (a bigger ring, or
    fewer apps, would take it)."""

    wire_fields: ClassVar[Mapping[str, type]] = {"no_capacity": bool}

    def __init__(self, message: str, *, no_capacity: bool = False) -> None:
        super().__init__(message)
        self.no_capacity = no_capacity


@crosses_peers("BrokerError")
class BrokerError(AppError):
    """An MQTT broker is not connected now, or refused a subscribe or a publish."""


@crosses_peers("MasterUnknown")
class MasterUnknown(AppError):
    """The master peer named by ``--master`` cannot be found in the ring."""


@crosses_peers("MasterBusy")
class MasterBusy(AppError):
    """The master's queue is full."""


@crosses_peers("CheckpointError")
class CheckpointError(AppError):
    """A checkpoint could not be saved or loaded (the message says which holder)."""


@crosses_peers("StoreFull")
class StoreFull(AppError):
    """This peer holds as many fragment bytes as it was allowed to."""


@crosses_peers("PeerLost")
class PeerLost(ExecutionError):
    """An instance could not send to a peer of its app: the scheduler checks whether
    that peer died and, if so, recovers the app instead of failing it."""

    wire_fields: ClassVar[Mapping[str, type]] = {"peer": str}

    def __init__(self, peer: str, detail: str) -> None:
        super().__init__(f"lost peer {peer}: {detail}")
        self.peer = peer
