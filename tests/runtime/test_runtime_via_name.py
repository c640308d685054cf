"""``--via NAME``: a client command reaches a peer by its name, looked up through the
peer that ``$AGILEDART_PEER`` names (before, only HOST:PORT was accepted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.processes import formed_cluster

pytestmark = [pytest.mark.processes]


def test_a_peer_is_reached_by_its_name_and_an_unknown_name_is_a_clear_error(
    tmp_path: Path,
) -> None:
    with formed_cluster(tmp_path, 3, ["--workers", "0"]) as trio:
        assert trio.workdir is not None
        env = {**os.environ, "AGILEDART_PEER": "{}:{}".format(*trio.address(0))}

        def ring(via: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [
                    *[sys.executable, "-m", "agiledart.cli", "--log-level", "warning"],
                    *["ring", "--via", via, "--json"],
                    *["--cluster-key-file", str(trio.workdir / "cluster.key")],
                ],
                capture_output=True,
                text=True,
                timeout=60,
                env=env,
            )

        for i in (0, 2):
            proc = ring(trio.name(i))
            assert proc.returncode == 0, proc.stderr
            assert json.loads(proc.stdout)["self"] == trio.name(i)
        proc = ring("gateway-9")
        assert proc.returncode == 1
        assert "no peer of that name" in proc.stderr
        env["AGILEDART_PEER"] = ""
        proc = ring("gateway-1")
        assert proc.returncode == 1
        assert "AGILEDART_PEER" in proc.stderr
