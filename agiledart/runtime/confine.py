"""What an app spec may reach on a peer that runs it: files and environment variables.

Theory of operation. Anyone holding the cluster key may submit a spec, and the spec's
connectors run as the peer's service user. So a peer confines them, by its own options,
whatever the spec says (a :class:`DataPolicy` is made from them):

* a ``file`` source reads, and a ``file`` sink writes, only inside the peer's *data
  root* (``--data-root DIR``; default the peer's ``--state-dir``) or a folder the peer
  allows (``--allow-path DIR``, repeatable). A source's relative ``path`` is read under
  the data root; a sink's relative ``path`` is written under
  ``<data root>/output/<app id>/``, and a sink may write only under
  ``<data root>/output`` (never over the node id, the code cache or the checkpoint
  fragments a state dir holds) or an allowed folder. Paths are resolved first (``..``
  and symbolic links followed), so neither leads out;
* ``password_env`` (an mqtt broker's password) reads only environment variables whose
  name starts with ``AGILEDART_SECRET_``, or that the peer allows by name
  (``--allow-env NAME``, repeatable).

A spec reaching further is refused when the app is deployed, with a
:class:`PathNotAllowed` or :class:`EnvNotAllowed` naming the connector, what it asked
and the option that would allow it; the app fails with that reason.

::

    ExecutionError                  (agiledart.app.errors)
    └── ConfinementError            a spec reaches past what this peer allows
        ├── PathNotAllowed          a file source or sink outside the data root
        └── EnvNotAllowed           a password_env this peer does not let specs read
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from agiledart.app.errors import ExecutionError

__all__ = [
    "ENV_PREFIX",
    "ConfinementError",
    "DataPolicy",
    "EnvNotAllowed",
    "PathNotAllowed",
]

#: environment variables with this prefix may be read by a spec's ``password_env``
ENV_PREFIX = "AGILEDART_SECRET_"


class ConfinementError(ExecutionError):
    """An app spec reaches past what this peer allows (files, environment)."""


class PathNotAllowed(ConfinementError):
    """A file source or sink names a path outside the peer's data root."""


class EnvNotAllowed(ConfinementError):
    """A spec's ``password_env`` names a variable this peer does not let specs read."""


@dataclass(frozen=True, kw_only=True)
class DataPolicy:
    """A peer's data root, the other folders it allows, and the variables specs may read."""

    root: Path
    allowed: tuple[Path, ...] = ()
    env_names: frozenset[str] = field(default_factory=frozenset)

    @classmethod
    def of(
        cls, root: Path, *, allow_paths: Iterable[Path] = (), allow_env: Iterable[str] = ()
    ) -> DataPolicy:
        return cls(
            root=_resolved(root),
            allowed=tuple(_resolved(p) for p in allow_paths),
            env_names=frozenset(allow_env),
        )

    @property
    def output(self) -> Path:
        """Where sinks write: ``<data root>/output``."""
        return self.root / "output"

    def sink_dir(self, app_id: str) -> Path:
        """Where a sink of ``app_id`` writes a relative path."""
        return self.output / app_id

    def source_path(self, owner: str, given: str | os.PathLike[str]) -> Path:
        """The file a source reads for its ``path``, once it is found inside the data
        root or an allowed folder."""
        return self._inside(owner, self.root / given, (self.root, *self.allowed), "reads")

    def sink_path(
        self, owner: str, given: str | os.PathLike[str], out_dir: str | os.PathLike[str]
    ) -> Path:
        """The file a sink writes for its ``path``, relative to ``out_dir``, once it is
        found inside ``<data root>/output`` or an allowed folder."""
        return self._inside(
            owner, Path(out_dir) / given, (self.output, *self.allowed), "writes", sink=True
        )

    def check_env(self, owner: str, name: str, *, param: str = "password_env") -> None:
        """Refuse a ``password_env`` (or ``param``) naming a variable specs may not read."""
        if (name.startswith(ENV_PREFIX) and len(name) > len(ENV_PREFIX)) or name in self.env_names:
            return
        msg = (
            f"{owner}: {param} names {name!r}, which this peer does not let app specs "
            f"read: name the variable {ENV_PREFIX}..., or start the peer with --allow-env {name}"
        )
        raise EnvNotAllowed(msg)

    def _inside(
        self, owner: str, path: Path, roots: tuple[Path, ...], verb: str, *, sink: bool = False
    ) -> Path:
        resolved = _resolved(path)
        if any(resolved == r or resolved.is_relative_to(r) for r in roots):
            return resolved
        where = f"{os.fspath(self.output)}" if sink else f"the data root {os.fspath(self.root)}"
        msg = (
            f"{owner} {verb} {os.fspath(resolved)!r}, outside {where} of this peer: use a "
            f"path under it, or start the peer with --allow-path DIR for a folder holding it"
        )
        raise PathNotAllowed(msg)


def _resolved(path: Path) -> Path:
    """``path`` absolute, ``..`` and symbolic links followed (what exists of it)."""
    return Path(os.path.abspath(path)).resolve(strict=False)
