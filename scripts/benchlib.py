"""Helpers shared by the benchmarks in this folder (each runs as ``python scripts/x.py``,
which puts this folder on ``sys.path``)."""

from __future__ import annotations

import socket
from pathlib import Path

__all__ = ["cpu_steal", "free_port", "steal_pct"]


def free_port() -> int:
    """A port free for both TCP and UDP on 127.0.0.1 (a peer listens on both)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
                u.bind(("127.0.0.1", port))
        except OSError:
            continue
        return port
    msg = "no free port"
    raise RuntimeError(msg)


def cpu_steal() -> tuple[int, int] | None:
    """(steal, total) jiffies from /proc/stat: how much a hypervisor took from us."""
    try:
        line = Path("/proc/stat").read_text().splitlines()[0]
        fields = [int(x) for x in line.split()[1:]]
    except (OSError, ValueError):
        return None
    return fields[7] if len(fields) > 7 else 0, sum(fields)


def steal_pct(a: tuple[int, int] | None, b: tuple[int, int] | None) -> float | None:
    """The share of CPU time, in %, the hypervisor took between readings ``a`` and ``b``."""
    if a is None or b is None or b[1] == a[1]:
        return None
    return round(100 * (b[0] - a[0]) / (b[1] - a[1]), 1)
