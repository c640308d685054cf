"""Errors of a peer's application runtime (all under :class:`~agiledart.app.errors.AppError`).

::

    AppError
    ├── UnknownApp      no app with that id (in the records store)
    ├── CodeError       a code id that is not registered, or a module that does not load
    ├── StoreError      the records store could not read or write a record
    ├── DeployError     an app could not be placed or deployed (nothing is left running)
    ├── BrokerError     an MQTT broker cannot be reached now, or refused a request (remote)
    └── ExecutionError
        └── PeerLost    an instance could not reach a peer of its app (it may have died)
"""

from __future__ import annotations

from agiledart.app.errors import AppError, ExecutionError

__all__ = ["BrokerError", "CodeError", "DeployError", "PeerLost", "StoreError", "UnknownApp"]


class UnknownApp(AppError):
    """No app with that id."""


class CodeError(AppError):
    """Registered code that is missing, corrupt, or does not define what is asked."""


class StoreError(AppError):
    """A record could not be stored or fetched."""


class DeployError(AppError):
    """Placement or deployment failed; every instance already deployed was torn down."""


class BrokerError(AppError):
    """An MQTT broker is not connected now, or refused a subscribe or a publish."""


class PeerLost(ExecutionError):
    """An instance could not send to a peer of its app: the scheduler checks whether
    that peer died and, if so, recovers the app instead of failing it."""

    def __init__(self, peer: str, detail: str) -> None:
        super().__init__(f"lost peer {peer}: {detail}")
        self.peer = peer
