"""Bundled applications (YAML app specs shipped with the package).

``urban-sensing`` (paper §VII), ``frequent-routes`` and ``profitable-areas`` (DEBS
2015 queries 1 and 2), ``word-count``, ``etl`` and ``stats`` (after RIoTBench), and
``throughput`` (filter -> map -> keyed running aggregate, 10^6 records). All are
finite (generator sources with a ``count``) and pin sources and sinks to peers named
``sensor-N`` and ``gateway-N``; their top-level ``params`` (rate, count, ...) can be
rebound with ``--set params.rate=500``.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable, Mapping
from importlib import resources
from typing import Any

from agiledart.app.errors import Problem, SpecError
from agiledart.app.parse import load_spec, parse_spec
from agiledart.app.spec import AppSpec

__all__ = ["load", "names", "text"]

_SUFFIX = ".yaml"


def names() -> list[str]:
    """The bundled apps' names, sorted."""
    files = resources.files(__name__).iterdir()
    return sorted(f.name[: -len(_SUFFIX)] for f in files if f.name.endswith(_SUFFIX))


def text(name: str) -> str:
    """The YAML text of a bundled app."""
    stem = name[: -len(_SUFFIX)] if name.endswith(_SUFFIX) else name
    if stem not in names():
        msg = f"no bundled app {name!r}; bundled apps: {', '.join(names())}"
        raise SpecError([Problem("", msg)])
    return resources.files(__name__).joinpath(stem + _SUFFIX).read_text(encoding="utf-8")


def load(
    name_or_path: str | os.PathLike[str],
    *,
    overrides: Iterable[str] | Mapping[str, Any] = (),
    known_peers: Collection[str] | None = None,
) -> AppSpec:
    """A bundled app by name (``"urban-sensing"``), or an app spec file by path."""
    name = os.fspath(name_or_path)
    stem = name[: -len(_SUFFIX)] if name.endswith(_SUFFIX) else name
    if stem in names() and not os.path.exists(name):
        return parse_spec(text(stem), overrides=overrides, known_peers=known_peers)
    if os.path.exists(name):
        return load_spec(name, overrides=overrides, known_peers=known_peers)
    msg = f"{name!r} is neither a bundled app ({', '.join(names())}) nor a file"
    raise SpecError([Problem("", msg)])
