"""Entry point of the agiledart image: ``peer`` (the default) runs a peer configured by
the environment, ``health`` is the image's health check, anything else runs as given
(``agiledart status ...``, ``agiledart sensors ...``, ``sh``).

The peer's settings (all optional):

=============================  ========================================================
``AGILEDART_LISTEN``           HOST:PORT for PORT/udp and PORT/tcp (``0.0.0.0:4000``)
``AGILEDART_NAME``             the peer's name; default: ``$AGILEDART_SERVICE-N`` for
                               the N-th replica of a compose service (``edge-3``, from
                               the container name that docker's DNS gives for its own
                               address), else the host name
``AGILEDART_SERVICE``          the compose service, for the default name
``AGILEDART_ZONE``             scheduling zone (``default``)
``AGILEDART_BOOTSTRAP``        peers to join through, by service or host name:
                               ``gateway-1:4000,gateway-2:4000``; this peer's own
                               address is left out, so every peer can share one list
``AGILEDART_ADVERTISE``        the address other peers should use (default: the
                               container's address)
``AGILEDART_CLUSTER_KEY_FILE`` the key file (a compose secret:
                               ``/run/secrets/cluster_key``), or the key itself in
                               ``AGILEDART_CLUSTER_KEY``; read by agiledart itself
``AGILEDART_STATE_DIR``        node id, code cache, sink files (``/var/lib/agiledart``)
``AGILEDART_TRACE_DIR``        traces, one folder per peer (``/traces``; empty: none)
``AGILEDART_WORKERS``          worker processes (default: the number of cores)
``AGILEDART_PEER_ARGS``        any other ``agiledart peer`` options, shell-quoted
=============================  ========================================================

Plain standard library, no agiledart import: it only builds a command line and
``exec``s it, so the peer is PID 1's only child (run with ``init: true``) and gets the
signals.
"""

from __future__ import annotations

import os
import random
import re
import shlex
import socket
import struct
import sys

DEFAULT_LISTEN = "0.0.0.0:4000"
DNS_PORT = 53


def own_address() -> str:
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def nameserver() -> str | None:
    try:
        with open("/etc/resolv.conf") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) >= 2 and parts[0] == "nameserver":
                    return parts[1]
    except OSError:
        pass
    return None


def _read_name(packet: bytes, at: int) -> tuple[str, int]:
    """A DNS name at ``at`` (with compression pointers); the offset after it."""
    labels: list[str] = []
    end = -1
    for _ in range(64):  # bounds a malicious pointer loop
        length = packet[at]
        if length == 0:
            at += 1
            break
        if length & 0xC0 == 0xC0:
            if end < 0:
                end = at + 2
            at = ((length & 0x3F) << 8) | packet[at + 1]
            continue
        labels.append(packet[at + 1 : at + 1 + length].decode("ascii", "replace"))
        at += 1 + length
    return ".".join(labels), (end if end >= 0 else at)


def reverse_name(ip: str, server: str, timeout: float = 1.0) -> str | None:
    """The PTR name of ``ip`` from ``server`` (docker's DNS answers with the container
    name: ``site_edge_3.site_default`` or ``site-edge-3.site_default``). /etc/hosts
    would answer with the container id first, so the query goes to the server itself."""
    qid = random.getrandbits(16)
    qname = b"".join(
        bytes([len(label)]) + label.encode()
        for label in [*reversed(ip.split(".")), "in-addr", "arpa"]
    )
    query = struct.pack("!HHHHHH", qid, 0x0100, 1, 0, 0, 0) + qname + b"\0" + b"\0\x0c\0\x01"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.settimeout(timeout)
            s.sendto(query, (server, DNS_PORT))
            packet = s.recv(4096)
        rid, _flags, qd, an = struct.unpack("!HHHH", packet[:8])
        if rid != qid or an == 0:
            return None
        at = 12
        for _ in range(qd):
            _, at = _read_name(packet, at)
            at += 4
        for _ in range(an):
            _, at = _read_name(packet, at)
            rtype, _cls, _ttl, rdlength = struct.unpack("!HHIH", packet[at : at + 10])
            at += 10
            if rtype == 12:
                return _read_name(packet, at)[0]
            at += rdlength
    except (OSError, IndexError, struct.error):
        return None
    return None


def peer_name(ip: str) -> str:
    if os.environ.get("AGILEDART_NAME"):
        return os.environ["AGILEDART_NAME"]
    service = os.environ.get("AGILEDART_SERVICE", "")
    server = nameserver()
    if service and server:
        for _ in range(5):  # docker's DNS knows the container from its start; be patient
            ptr = reverse_name(ip, server)
            if ptr and (m := re.search(r"[_-](\d+)$", ptr.split(".")[0])):
                return f"{service}-{m[1]}"
    return socket.gethostname()


def bootstrap(ip: str, listen_port: str) -> list[str]:
    """The bootstrap list without this peer's own address (a name that does not
    resolve yet stays: the peer keeps retrying)."""
    out = []
    for item in re.split(r"[,\s]+", os.environ.get("AGILEDART_BOOTSTRAP", "").strip()):
        if not item:
            continue
        host, _, port = item.rpartition(":") if ":" in item else (item, "", listen_port)
        try:
            resolved = {info[4][0] for info in socket.getaddrinfo(host, None, socket.AF_INET)}
        except OSError:
            resolved = set()
        if ip in resolved and port == listen_port:
            continue
        out.append(f"{host}:{port}")
    return out


def peer_command() -> list[str]:
    env = os.environ
    listen = env.get("AGILEDART_LISTEN") or DEFAULT_LISTEN
    port = listen.rpartition(":")[2]
    ip = env.get("AGILEDART_ADVERTISE") or own_address()
    cmd = ["agiledart", "peer", "--listen", listen, "--name", peer_name(ip)]
    cmd += ["--advertise", ip]
    for b in bootstrap(ip, port):
        cmd += ["--bootstrap", b]
    for var, flag in [
        ("AGILEDART_ZONE", "--zone"),
        ("AGILEDART_STATE_DIR", "--state-dir"),
        ("AGILEDART_TRACE_DIR", "--trace-dir"),
        ("AGILEDART_WORKERS", "--workers"),
    ]:
        if env.get(var):
            cmd += [flag, env[var]]
    cmd += shlex.split(env.get("AGILEDART_PEER_ARGS", ""))
    return cmd


def health_command() -> list[str]:
    port = (os.environ.get("AGILEDART_LISTEN") or DEFAULT_LISTEN).rpartition(":")[2]
    return ["agiledart", "--log-level", "error", "ring", "--json", "--via", f"127.0.0.1:{port}"]


def main(argv: list[str]) -> None:
    what = argv[0] if argv else "peer"
    if what == "peer":
        cmd = [*peer_command(), *argv[1:]]
        print("entrypoint:", shlex.join(cmd), file=sys.stderr, flush=True)
    elif what == "health":
        cmd = health_command()
    else:
        cmd = argv
    os.execvp(cmd[0], cmd)


if __name__ == "__main__":
    main(sys.argv[1:])
