"""``HOST:PORT`` text into an address: a module of its own, so that a command that only
talks to a peer need not import the peer (and the runtime behind it)."""

from __future__ import annotations

from agiledart.overlay.errors import ConfigError

__all__ = ["Address", "parse_address"]

Address = tuple[str, int]


def parse_address(
    text: str, *, default_port: int | None = None, listening: bool = False
) -> Address:
    """``HOST:PORT`` (or ``[v6]:PORT``) into a tuple, with a clear error."""
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = text, "" if default_port is None else str(default_port)
    host = host.strip("[]")
    lowest = 0 if listening else 1  # port 0 when listening: any free port
    if not host or not port.isdigit() or not lowest <= int(port) < 65536:
        msg = f"{text!r} is not HOST:PORT (e.g. 127.0.0.1:4000)"
        raise ConfigError(msg)
    return host, int(port)
