"""Fixtures for the overlay tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.processes import clusters

from agiledart.emulation import LocalCluster


@pytest.fixture
def cluster_factory(tmp_path: Path) -> Iterator[Callable[..., LocalCluster]]:
    with clusters(tmp_path) as make:
        yield make
