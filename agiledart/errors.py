"""The root of every agiledart exception.

Each package hangs its own tree below :class:`AgiledartError`::

    AgiledartError
    ├── agiledart.overlay.errors.OverlayError      (DHT ring, routing, auth, framing)
    ├── agiledart.recovery.errors.RecoveryError    (fragments, checkpoints)
    ├── agiledart.bandit.errors.BanditError        (graphs, policies)
    └── agiledart.app.errors.AppError              (specs, placement, runtime)

The CLI catches only :class:`AgiledartError`, prints ``Error: <message>`` and exits 1.
Local misuse and remote misbehaviour are separate subclasses in each tree.
"""

from __future__ import annotations


class AgiledartError(Exception):
    """Base class of every error agiledart raises on purpose."""
