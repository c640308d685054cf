"""A local cluster of real peer processes on loopback, for the emulation, tests and
benchmarks.

:class:`LocalCluster` starts ``peers`` ``agiledart peer`` processes, each on its own
loopback address (127.0.0.2 ...) and one port, with a fresh cluster key in its working
directory, named as the bundled apps expect (:func:`site_name`); it asks them over
authenticated frames (:meth:`LocalCluster.request`) and tears them all down on exit.
``agiledart emulate`` (:mod:`agiledart.cli.emulate`) is the command around it.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agiledart.errors import AgiledartError
from agiledart.overlay.auth import ClusterKey
from agiledart.overlay.keys import key_file_text, make_key_text
from agiledart.overlay.tcp import FrameClient

__all__ = ["PORT", "LocalCluster", "site_name"]

PORT = 4700


def site_name(i: int) -> str:
    """Peer names of an emulated site: the names the bundled apps pin to come first."""
    fixed = ("sensor-1", "sensor-2", "gateway-1", "gateway-2")
    return fixed[i] if i < len(fixed) else f"edge-{i - len(fixed) + 1}"


@dataclass
class LocalCluster:
    """N real peer processes on 127.0.0.2 .. 127.0.0.N+1, torn down on exit."""

    peers: int
    port: int = PORT
    workdir: Path | None = None
    extra_args: list[str] = field(default_factory=list)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not 1 <= self.peers <= 250:
            msg = "--peers must be between 1 and 250"
            raise AgiledartError(msg)
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self.key_material = key_file_text([make_key_text()])
        self.key = ClusterKey.from_material(self.key_material)

    def address(self, i: int) -> tuple[str, int]:
        return (f"127.0.0.{i + 2}", self.port)

    def name(self, i: int) -> str:
        return site_name(i)

    def __enter__(self) -> LocalCluster:
        if self.workdir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="agiledart-emulate-")
            self.workdir = Path(self._tmp.name)
        key_file = self.workdir / "cluster.key"
        key_file.write_text(self.key_material)
        key_file.chmod(0o600)
        try:
            for i in range(self.peers):
                self.procs.append(self.start(i))
        except BaseException:
            self.__exit__()
            raise
        return self

    def start(self, i: int) -> subprocess.Popen[bytes]:
        assert self.workdir is not None
        host, port = self.address(i)
        cmd = [
            sys.executable,
            "-m",
            "agiledart.cli",
            "--log-level",
            "warning",
            "peer",
            "--listen",
            f"{host}:{port}",
            "--name",
            self.name(i),
            "--state-dir",
            str(self.workdir / self.name(i)),
            "--cluster-key-file",
            str(self.workdir / "cluster.key"),
            *self.extra_args,
            *self.bootstrap(i),
        ]
        with (self.workdir / f"{self.name(i)}.log").open("ab") as log:
            return subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def bootstrap(self, i: int) -> list[str]:
        """Peer ``i``'s ``--bootstrap`` arguments: peer 0's address (none for peer 0)."""
        return ["--bootstrap", "{}:{}".format(*self.address(0))] if i > 0 else []

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 5
        for proc in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()
        if self._tmp is not None:
            self._tmp.cleanup()

    def kill(self, i: int) -> None:
        """``kill -9`` one peer."""
        self.procs[i].kill()
        self.procs[i].wait()

    def restart(self, i: int) -> None:
        """``kill -9`` one peer and start it again at once, with its state directory
        (a power cut, a crash under a supervisor that restarts it)."""
        self.kill(i)
        self.procs[i] = self.start(i)

    async def request(self, i: int, rpc: str, body: dict[str, Any], timeout: float = 5.0) -> Any:
        host, port = self.address(i)
        client = await FrameClient.connect(
            host, port, key=self.key, name="emulate", timeout=timeout
        )
        async with client:
            return await client.request(rpc, body, timeout=timeout)

    async def ring(self, i: int) -> dict[str, Any] | None:
        try:
            info: dict[str, Any] = await self.request(i, "ring", {})
        except AgiledartError:
            return None
        return info

    async def wait_formed(self, *, timeout: float = 60.0) -> list[dict[str, Any]]:
        """Poll until every peer knows every other peer by name; fail at once when a
        peer process has exited (its last log line says why)."""
        want = {self.name(i) for i in range(self.peers)}
        deadline = time.monotonic() + timeout
        while True:
            self._check_alive()
            rings = await asyncio.gather(*(self.ring(i) for i in range(self.peers)))
            if all(
                r is not None and {p["name"] for p in r["peers"]} | {r["self"]} >= want
                for r in rings
            ):
                return [r for r in rings if r is not None]
            if time.monotonic() > deadline:
                msg = f"the ring did not form within {timeout:.0f} s"
                raise AgiledartError(msg)
            await asyncio.sleep(0.3)

    def _check_alive(self) -> None:
        for i, proc in enumerate(self.procs):
            code = proc.poll()
            if code is None:
                continue
            last = ""
            if self.workdir is not None:
                with contextlib.suppress(OSError):
                    lines = (self.workdir / f"{self.name(i)}.log").read_text().splitlines()
                    last = next((ln for ln in reversed(lines) if ln.strip()), "")
            msg = f"peer {self.name(i)} exited with code {code}" + (f": {last}" if last else "")
            raise AgiledartError(msg)
