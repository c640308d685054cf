"""What the scheduler tells every peer hosting part of an app (:class:`Deployment`),
and the knobs of a peer's instances (:class:`InstanceOptions`)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agiledart.app.errors import ExecutionError
from agiledart.app.spec import AppSpec
from agiledart.runtime.links import Address
from agiledart.runtime.topology import fed

__all__ = ["Deployment", "InstanceOptions"]


@dataclass(frozen=True, kw_only=True)
class InstanceOptions:
    batch_records: int = 1000  #: records per data frame, at most
    linger_s: float = 0.005  #: a partial batch leaves this long after its first record
    credits: int = 32  #: batches in flight per edge
    source_queue: int = 4  #: source batches waiting in a segment's inbox, at most
    trace_rate: float = 0.05
    watermark_interval_s: float = 0.01  #: a source's watermarks go out at most this often
    overload: str = "block"  #: block | shed, for sources that fall behind


@dataclass(frozen=True, kw_only=True)
class Deployment:
    """What the scheduler tells every hosting peer."""

    app_id: str
    spec: AppSpec
    hosts: dict[str, tuple[str, ...]]  #: node id -> peer names hosting it
    addresses: dict[str, Address]  #: peer name -> address
    scheduler: Address
    #: incremented by every recovery: frames and reports of an older one are dropped
    generation: int = 0
    #: the committed checkpoint to start from (epochs.py), None: from the beginning
    restore: dict[str, Any] | None = None

    def to_wire(self) -> dict[str, Any]:
        return {
            "app_id": self.app_id,
            "spec": self.spec.to_dict(),
            "hosts": {k: list(v) for k, v in self.hosts.items()},
            "addresses": {k: list(v) for k, v in self.addresses.items()},
            "scheduler": list(self.scheduler),
            "generation": self.generation,
            "restore": self.restore,
        }

    @classmethod
    def from_wire(cls, raw: dict[str, Any], parse: Callable[[Any], AppSpec]) -> Deployment:
        try:
            app_id = raw["app_id"]
            if not isinstance(app_id, str) or not _APP_ID_RE.match(app_id):
                msg = f"app id must be letters, digits, '-' or '_' (1-96), got {app_id!r}"
                raise ValueError(msg)
            hosts = {str(k): _names(v) for k, v in raw["hosts"].items()}
            addresses = {str(k): _address(v) for k, v in raw["addresses"].items()}
            d = cls(
                app_id=app_id,
                spec=parse(raw["spec"]),
                hosts=hosts,
                addresses=addresses,
                scheduler=_address(raw["scheduler"]),
                generation=int(raw.get("generation", 0)),
                restore=_restore_plan(raw.get("restore")),
            )
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
            msg = f"malformed deployment: {type(exc).__name__}: {exc}"
            raise ExecutionError(msg) from exc
        nodes = [s.id for s in d.spec.sources] + [node for node, _ in fed(d.spec)]
        unhosted = sorted(n for n in nodes if not d.hosts.get(n))
        unknown = sorted({p for ps in d.hosts.values() for p in ps} - set(d.addresses))
        if unhosted or unknown:
            msg = f"deployment places no peer for {unhosted} or has no address for {unknown}"
            raise ExecutionError(msg)
        return d


_APP_ID_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]{0,95}$")


def _names(raw: Any) -> tuple[str, ...]:
    if not isinstance(raw, list | tuple) or not all(isinstance(x, str) and x for x in raw):
        msg = f"hosts must be lists of peer names, got {raw!r}"
        raise TypeError(msg)
    return tuple(raw)


def _address(raw: Any) -> Address:
    if not (
        isinstance(raw, list | tuple)
        and len(raw) == 2
        and isinstance(raw[0], str)
        and type(raw[1]) is int
        and 0 < raw[1] < 65536
    ):
        msg = f"an address is [host, port], got {raw!r}"
        raise TypeError(msg)
    return (raw[0], raw[1])


def _restore_plan(raw: Any) -> dict[str, Any] | None:
    """A deployment's ``restore`` (written by the scheduler), checked for shape."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or type(raw.get("epoch")) is not int:
        msg = "restore needs an integer 'epoch'"
        raise ValueError(msg)
    for entry in raw.get("states", ()):
        if not isinstance(entry, dict) or not {"peer", "ops", "instance", "holders", "m"} <= set(
            entry
        ):
            msg = f"malformed restore entry {entry!r}"
            raise ValueError(msg)
    return raw
