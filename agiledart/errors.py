"""The root of every agiledart exception, and the registry of those that cross peers.

Each package hangs its own tree below :class:`AgiledartError`::

    AgiledartError
    ├── agiledart.overlay.errors.OverlayError      (DHT ring, routing, auth, framing)
    ├── agiledart.recovery.errors.RecoveryError    (fragments, erasure coding)
    ├── agiledart.bandit.errors.BanditError        (graphs, policies)
    ├── agiledart.app.errors.AppError              (specs, placement, runtime)
    ├── agiledart.dataplane.errors.DataPlaneError  (batches, credit, sequences)
    ├── agiledart.scaling.errors.ScalingError      (health scores, the secant rule)
    ├── agiledart.traces.errors.TraceError         (trace records)
    ├── agiledart.analysis.errors.AnalysisError    (trace analysis, Spark)
    └── agiledart.site.errors.SiteError            (dashboard, metrics endpoint)

The modules at the top of the ``agiledart`` package (``peer``, ``zones``,
``largescale``) derive their few errors from :class:`AgiledartError` directly: it is
their package's root. ``tests/test_error_tree.py`` walks every module and checks this.

The CLI catches only :class:`AgiledartError`, prints ``Error: <message>`` and exits 1.
Local misuse and remote misbehaviour are separate subclasses in each tree.

**Errors that cross a peer.** A request handler that fails with an
:class:`AgiledartError` answers with the error's *wire name*, its message and its
declared *wire fields*; the caller's frame connection (``overlay/tcp.py``, the one seam
every request goes through) raises the same class there, rebuilt by
:func:`error_from_wire`, with :attr:`AgiledartError.remote_peer` naming the peer that
raised it. A class crosses when it is registered with :func:`crosses_peers`; one that
is not crosses as its nearest registered ancestor (the package roots all are). A name
the caller does not know becomes the overlay's generic ``RemoteError``, which keeps it.
Nothing is ever matched by the text of its message.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Self, TypeVar

__all__ = [
    "MAX_WIRE_MESSAGE",
    "AgiledartError",
    "crosses_peers",
    "crossing_errors",
    "error_from_wire",
    "error_to_wire",
]

#: an error message longer than this is cut when it is sent (and refused when received
#: longer: only a hostile or broken peer sends one)
MAX_WIRE_MESSAGE = 16 * 1024
#: an error reply with more fields than this is refused
MAX_WIRE_FIELDS = 16
#: the longest wire name
MAX_WIRE_NAME = 64


class AgiledartError(Exception):
    """Base class of every error agiledart raises on purpose."""

    #: the attributes, beyond the message, that travel with the error to another peer:
    #: name -> type of a plain value (str, int, float, bool)
    wire_fields: ClassVar[Mapping[str, type]] = {}

    #: the peer whose request handler raised this error; None when raised here
    remote_peer: str | None = None

    @classmethod
    def wire_state(cls, error: AgiledartError) -> dict[str, Any]:
        """The fields ``error`` sends when it crosses as this class: this class's
        :attr:`wire_fields` (``error`` may be of a subclass with more)."""
        return {name: getattr(error, name) for name in cls.wire_fields}

    @classmethod
    def from_wire_state(cls, message: str, state: Mapping[str, Any]) -> Self:
        """The error as its sender had it; ``ValueError`` if ``state`` does not fit
        :attr:`wire_fields` (a remote's mistake, which the seam reports as such)."""
        values = {}
        for name, kind in cls.wire_fields.items():
            value = state.get(name)
            if kind is float and type(value) is int:
                value = float(value)
            if type(value) is not kind or (isinstance(value, float) and not math.isfinite(value)):
                msg = f"{cls.__name__}.{name} should be a {kind.__name__}"
                raise ValueError(msg)
            values[name] = value
        error = cls.__new__(cls)
        Exception.__init__(error, message)
        for name, value in values.items():
            setattr(error, name, value)
        return error


E = TypeVar("E", bound=type[AgiledartError])

_REGISTRY: dict[str, type[AgiledartError]] = {}
_NAMES: dict[type[AgiledartError], str] = {}

#: the modules whose classes register themselves: imported before the first error is
#: rebuilt, so a caller knows every class whatever it imported itself
_DECLARED_IN = (
    "agiledart.app.errors",
    "agiledart.runtime.errors",
    "agiledart.overlay.errors",
    "agiledart.recovery.errors",
)


def crosses_peers(wire_name: str) -> Callable[[E], E]:
    """Register an error class under a stable ``wire_name`` (class decorator)."""

    def register(cls: E) -> E:
        known = _REGISTRY.get(wire_name)
        if known is not None and known is not cls:
            msg = f"wire name {wire_name!r} is taken by {known.__qualname__}"
            raise TypeError(msg)
        if not 0 < len(wire_name) <= MAX_WIRE_NAME:
            msg = f"a wire name is 1 to {MAX_WIRE_NAME} characters"
            raise TypeError(msg)
        _REGISTRY[wire_name] = cls
        _NAMES[cls] = wire_name
        return cls

    return register


def crossing_errors() -> dict[str, type[AgiledartError]]:
    """Every registered class by its wire name (all declaring modules imported)."""
    _load()
    return dict(_REGISTRY)


def error_to_wire(error: AgiledartError) -> tuple[str, str, dict[str, Any]]:
    """``(wire name, message, fields)`` of ``error``: its nearest registered class whose
    fields it can fill as the caller will check them (else the next one up), or its
    own class name (which the caller will not know) if none is registered."""
    message = str(error)[:MAX_WIRE_MESSAGE]
    for cls in type(error).__mro__:
        if not (issubclass(cls, AgiledartError) and cls in _NAMES):
            continue
        name = _NAMES[cls]
        try:
            fields = cls.wire_state(error)
            cls.from_wire_state(message, fields)  # what the caller will do with them
        except (AttributeError, TypeError, ValueError):
            continue  # a field unset or of the wrong type here: send less, never fail
        return name, message, fields
    return type(error).__name__, message, {}


def error_from_wire(name: str, message: str, fields: Any) -> AgiledartError | None:
    """The error a peer answered with, as its local class; None if ``name`` is not
    registered here. ``ValueError`` if what came is not what that class sends."""
    _load()
    cls = _REGISTRY.get(name)
    if cls is None:
        return None
    if len(message) > MAX_WIRE_MESSAGE:
        msg = f"an error message of {len(message)} characters"
        raise ValueError(msg)
    if fields is None:
        fields = {}
    if type(fields) is not dict or len(fields) > MAX_WIRE_FIELDS:
        msg = f"the fields of a {name} are a map of at most {MAX_WIRE_FIELDS} entries"
        raise ValueError(msg)
    return cls.from_wire_state(message, fields)


_loaded = False


def _load() -> None:
    global _loaded
    if not _loaded:
        for module in _DECLARED_IN:
            importlib.import_module(module)
        _loaded = True
