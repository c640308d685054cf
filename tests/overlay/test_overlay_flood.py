"""A keyless connection flood against a real peer: it keeps serving its CLI and its peers."""

from __future__ import annotations

import contextlib
import errno
import socket
import threading
import time
from collections import deque
from collections.abc import Callable

import pytest
from support.processes import cli, poll, try_cli_json

from agiledart.emulation import LocalCluster

pytestmark = [pytest.mark.processes, pytest.mark.timeout(300)]

OPEN_AT_ONCE = 2000  #: unauthenticated sockets held open against the peer
CHURN_PER_S = 400  #: once they are open, new ones (closing the oldest) per second
MAX_OPENS = 60_000  #: the flood stops by itself after this many connections ...
MAX_FLOOD_S = 120.0  #: ... or this long
ROUNDS = 6  #: of four CLI requests each, while the flood churns
SOURCES = [f"127.0.1.{i}" for i in range(1, 41)]  #: the flooding hosts (loopback)


class Flood(threading.Thread):
    """Churns ``OPEN_AT_ONCE`` idle TCP connections (no handshake) against ``target``:
    opens until that many are open, then closes the oldest for every new one."""

    def __init__(self, target: tuple[str, int]) -> None:
        super().__init__(daemon=True)
        self.target = target
        self.stop = threading.Event()
        self.opened = 0
        self.peak_open = 0

    def run(self) -> None:
        held: deque[socket.socket] = deque()
        deadline = time.monotonic() + MAX_FLOOD_S
        try:
            while not self.stop.is_set() and self.opened < MAX_OPENS:
                if time.monotonic() > deadline:
                    break
                if len(held) >= OPEN_AT_ONCE:
                    held.popleft().close()
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.setblocking(False)
                sock.bind((SOURCES[self.opened % len(SOURCES)], 0))
                err = sock.connect_ex(self.target)
                if err not in (0, errno.EINPROGRESS, errno.EAGAIN):
                    sock.close()
                    time.sleep(0.01)
                    continue
                held.append(sock)
                self.opened += 1
                self.peak_open = max(self.peak_open, len(held))
                if len(held) >= OPEN_AT_ONCE:
                    time.sleep(1 / CHURN_PER_S)
        finally:
            for sock in held:
                with contextlib.suppress(OSError):
                    sock.close()


def test_a_keyless_flood_of_2000_sockets_refuses_no_legitimate_request(
    cluster_factory: Callable[[int], LocalCluster],
) -> None:
    cluster = cluster_factory(2)
    via0 = ["--via", "{}:{}".format(*cluster.address(0))]
    via1 = ["--via", "{}:{}".format(*cluster.address(1))]
    other = cluster.name(1)

    def formed() -> bool:
        info = try_cli_json(cluster, "ring", *via0)
        return info is not None and other in info["leaf_set"]

    poll(formed, what="both peers in one ring")

    flood = Flood(cluster.address(0))
    flood.start()
    poll(lambda: flood.opened >= OPEN_AT_ONCE, what="the flood to open its sockets")
    failures: list[str] = []
    calls = 0
    try:
        for _ in range(ROUNDS):
            for args in (
                ("ring", "--json", *via0),
                ("apps", *via0),
                ("route", other, "--json", *via0),
                ("ring", "--json", *via1),
            ):
                proc = cli(cluster, *args, check=False)
                calls += 1
                if proc.returncode != 0:
                    failures.append(f"{args[0]}: {proc.stderr.strip()}")
            info = try_cli_json(cluster, "ring", *via1)
            peers = {p["name"]: p for p in info["peers"]} if info else {}
            if cluster.name(0) not in peers or peers[cluster.name(0)]["suspect"]:
                failures.append(f"{other} lost sight of {cluster.name(0)}: {info}")
        churned_throughout = flood.is_alive()
    finally:
        flood.stop.set()
        flood.join()
    assert flood.peak_open == OPEN_AT_ONCE
    assert churned_throughout
    assert failures == [], f"{len(failures)} of {calls} requests refused"
