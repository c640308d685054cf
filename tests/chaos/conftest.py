"""The soak of ``scripts/chaos.py``, loaded as a module for the short CI version."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def chaos() -> ModuleType:
    spec = importlib.util.spec_from_file_location("chaos", ROOT / "scripts" / "chaos.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["chaos"] = module
    spec.loader.exec_module(module)
    return module
