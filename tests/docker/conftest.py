"""The docker site of ``scripts/docker_emulation.py``, built and brought up once per
module: Docker Engine (started here when it does not run: Debian's docker.io, as
root), the local Debian base (debootstrap + docker import, cached), the project's
wheels, the images, then Mosquitto, the sensor simulator and 6 peers. Torn down at the
end, leaving no container, network or volume. A machine without Docker fails these
tests loudly (``scripts/setup.sh`` installs it); they never skip."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def emulation() -> ModuleType:
    return _load("docker_emulation", ROOT / "scripts" / "docker_emulation.py")


@pytest.fixture(scope="session")
def entrypoint() -> ModuleType:
    return _load("agiledart_docker_entrypoint", ROOT / "docker" / "entrypoint.py")


@pytest.fixture(scope="module")
def site(emulation: ModuleType) -> Iterator[object]:
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(emulation.docker_engine())
        except emulation.EmulationError as exc:
            hint = "run `make setup` as root (scripts/setup.sh installs docker.io)"
            pytest.fail(f"no Docker Engine: {exc}; {hint}", pytrace=False)
        emulation.remove_stale("agiledart-test-")  # what an interrupted run left behind
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="agiledart-docker-"))
        site = emulation.Site(f"agiledart-test-{os.getpid()}", Path(tmp))
        emulation.build_images(site.env, site.compose)
        try:
            site.up()
            site.wait_formed()
            yield site
        finally:
            site.down()
            assert site.leftovers() == []
