"""Every exception class of the project hangs under its package's root error, and every
error that may cross a peer is registered where a caller will find it."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Iterator
from types import ModuleType

import agiledart
import agiledart.bandit
import agiledart.overlay
import agiledart.recovery
from agiledart.analysis.errors import AnalysisError
from agiledart.app.errors import AppError
from agiledart.bandit.errors import BanditError
from agiledart.dataplane.errors import DataPlaneError
from agiledart.errors import _DECLARED_IN, AgiledartError, crossing_errors
from agiledart.overlay.errors import OverlayError
from agiledart.recovery.errors import RecoveryError
from agiledart.scaling.errors import ScalingError
from agiledart.site.errors import SiteError
from agiledart.traces.errors import TraceError

#: package -> its root error; the longest matching prefix of a module's name wins (the
#: modules at the top of ``agiledart`` have the project's root as theirs)
ROOTS: dict[str, type[AgiledartError]] = {
    "agiledart": AgiledartError,
    "agiledart.overlay": OverlayError,
    "agiledart.recovery": RecoveryError,
    "agiledart.bandit": BanditError,
    "agiledart.dataplane": DataPlaneError,
    "agiledart.scaling": ScalingError,
    "agiledart.site": SiteError,
    "agiledart.analysis": AnalysisError,
    "agiledart.traces": TraceError,
    "agiledart.app": AppError,
    "agiledart.runtime": AppError,
    "agiledart.operators": AppError,
    "agiledart.placement": AppError,
    "agiledart.datasets": AppError,
    "agiledart.apps": AppError,
}


def _modules() -> Iterator[ModuleType]:
    for package in (agiledart, agiledart.overlay, agiledart.bandit, agiledart.recovery):
        yield package
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if not info.name.endswith("__main__"):
                yield importlib.import_module(info.name)


def _root(module: str) -> type[AgiledartError]:
    package = max((p for p in ROOTS if module == p or module.startswith(p + ".")), key=len)
    return ROOTS[package]


def test_every_exception_class_is_under_its_packages_root_error() -> None:
    found, outside = 0, []
    for module in _modules():
        for name, cls in vars(module).items():
            if not (inspect.isclass(cls) and issubclass(cls, BaseException)):
                continue
            if cls.__module__ != module.__name__:
                continue  # imported, checked where it is defined
            found += 1
            root = _root(module.__name__)
            if not issubclass(cls, root):
                outside.append(f"{module.__name__}.{name} is not under {root.__name__}")
    assert not outside, "\n".join(outside)
    assert found > 60  # the walk saw the project, not an empty path


def test_the_package_roots_derive_from_the_project_root() -> None:
    for root in ROOTS.values():
        assert issubclass(root, AgiledartError)


def test_every_error_that_crosses_is_declared_where_a_caller_loads_it() -> None:
    for name, cls in crossing_errors().items():
        assert cls.__module__ in _DECLARED_IN, name
        assert issubclass(cls, AgiledartError), name
