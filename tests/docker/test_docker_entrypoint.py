"""The image's entry point (docker/entrypoint.py), without docker: the peer's command
line from the environment, names of compose replicas from docker's reverse DNS, the
bootstrap list without the peer itself; and the key file named by
``$AGILEDART_CLUSTER_KEY_FILE`` (a compose secret)."""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from agiledart.overlay.auth import ClusterKey, load_cluster_key
from agiledart.overlay.errors import ConfigError
from agiledart.overlay.keys import make_key_text


def ptr_answer(query: bytes, name: str) -> bytes:
    """A DNS response to ``query`` with one PTR record (the name compressed against
    the question, as docker's resolver does)."""
    qid = query[:2]
    question = query[12:]
    rdata = b"".join(bytes([len(x)]) + x.encode() for x in name.split(".")) + b"\0"
    answer = b"\xc0\x0c" + struct.pack("!HHIH", 12, 1, 600, len(rdata)) + rdata
    return qid + struct.pack("!HHHHH", 0x8180, 1, 1, 0, 0) + question + answer


@pytest.fixture
def dns() -> Iterator[tuple[tuple[str, int], dict[str, str]]]:
    """A one-thread DNS server on loopback answering PTR queries from a table."""
    names: dict[str, str] = {}
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                query, addr = sock.recvfrom(512)
            except TimeoutError:
                continue
            labels, at = [], 12
            while query[at]:
                labels.append(query[at + 1 : at + 1 + query[at]].decode())
                at += 1 + query[at]
            ip = ".".join(reversed(labels[:4]))
            if ip in names:
                sock.sendto(ptr_answer(query, names[ip]), addr)
            else:  # NXDOMAIN
                header = struct.pack("!HHHHH", 0x8183, 1, 0, 0, 0)
                sock.sendto(query[:2] + header + query[12:], addr)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield sock.getsockname(), names
    stop.set()
    thread.join()
    sock.close()


def test_a_replica_is_named_after_its_service_and_number(
    entrypoint: ModuleType,
    dns: tuple[tuple[str, int], dict[str, str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (server, port), names = dns
    monkeypatch.setattr(entrypoint, "DNS_PORT", port)
    names["172.31.77.5"] = "site_edge_3.site_site"  # compose v1
    names["172.31.77.6"] = "site-edge-12.site_site"  # compose v2
    monkeypatch.delenv("AGILEDART_NAME", raising=False)
    monkeypatch.setenv("AGILEDART_SERVICE", "edge")
    monkeypatch.setattr(entrypoint, "nameserver", lambda: server)
    assert entrypoint.reverse_name("172.31.77.5", server) == "site_edge_3.site_site"
    assert entrypoint.peer_name("172.31.77.5") == "edge-3"
    assert entrypoint.peer_name("172.31.77.6") == "edge-12"
    # no PTR record: the host name, as a plain container would have it
    assert entrypoint.peer_name("172.31.77.7") == socket.gethostname()
    monkeypatch.setenv("AGILEDART_NAME", "pi-kitchen")
    assert entrypoint.peer_name("172.31.77.5") == "pi-kitchen"


def test_the_peer_command_comes_from_the_environment_without_itself_as_bootstrap(
    entrypoint: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var, value in {
        "AGILEDART_NAME": "gateway-1",
        "AGILEDART_ADVERTISE": "127.0.0.1",
        "AGILEDART_LISTEN": "0.0.0.0:4100",
        # itself (localhost resolves to its advertised address), another peer, one
        # whose name does not resolve yet (kept: the peer retries), another port
        "AGILEDART_BOOTSTRAP": "localhost:4100, gw-2.invalid:4100 localhost:4200",
        "AGILEDART_ZONE": "uplink",
        "AGILEDART_TRACE_DIR": "/traces",
        "AGILEDART_WORKERS": "0",
        "AGILEDART_PEER_ARGS": "--metrics-port 9100 --offload-us '5'",
    }.items():
        monkeypatch.setenv(var, value)
    monkeypatch.delenv("AGILEDART_STATE_DIR", raising=False)
    cmd = entrypoint.peer_command()
    assert cmd[:2] == ["agiledart", "peer"]
    args = cmd[2:]
    pairs = list(zip(args[::2], args[1::2], strict=True))
    assert ("--listen", "0.0.0.0:4100") in pairs
    assert ("--name", "gateway-1") in pairs
    assert ("--advertise", "127.0.0.1") in pairs
    assert [v for k, v in pairs if k == "--bootstrap"] == ["gw-2.invalid:4100", "localhost:4200"]
    assert ("--zone", "uplink") in pairs
    assert ("--trace-dir", "/traces") in pairs
    assert ("--workers", "0") in pairs
    assert ("--metrics-port", "9100") in pairs
    assert ("--offload-us", "5") in pairs
    assert "--state-dir" not in args
    assert entrypoint.health_command()[-2:] == ["--via", "127.0.0.1:4100"]


def test_a_key_file_named_by_the_environment_is_read(tmp_path: Path) -> None:
    key = tmp_path / "cluster_key"
    key.write_text(make_key_text() + "\n")
    env = {"AGILEDART_CLUSTER_KEY_FILE": str(key), "AGILEDART_CLUSTER_KEY": make_key_text()}
    got = load_cluster_key(None, insecure=False, environ=env)
    assert got == ClusterKey.from_material(key.read_bytes())
    # --cluster-key-file still wins; a missing file is an error that names it
    other = tmp_path / "other"
    other.write_text(make_key_text())
    assert load_cluster_key(other, insecure=False, environ=env) == ClusterKey.from_material(
        other.read_bytes()
    )
    with pytest.raises(ConfigError, match="missing"):
        load_cluster_key(None, insecure=False, environ={"AGILEDART_CLUSTER_KEY_FILE": "/missing"})
