"""Several instances of one operator on one peer (scale up, paper §IV-C).

Theory of operation. Scaling an operator up on a peer gives its segment (one inbox,
one task) ``n`` *replicas*: :class:`~agiledart.runtime.execution.Unit` s that the
peer's engine runs on different workers at once. The segment's task stays the one
point where input is taken, so the replicas behave as one instance to everything
around them:

* a batch is split (:func:`split_records`): by key for a keyed operator, the key's
  replica being ``(stable_hash(key) >> 32) mod n`` (the high bits: the low ones already
  chose the peer when the operator runs on several peers); a stateless operator's batch
  is cut into ``n`` contiguous runs, so that concatenating the replicas' outputs in
  replica order keeps the input order;
* every replica gets every watermark; their outputs are combined
  (:func:`combine`): records first, per consumer in replica order, then one watermark
  per consumer, the minimum, so no watermark overtakes a replica's records;
* a checkpoint stores the merged state of the replicas (:func:`merge_snapshots`), so
  what is restored never depends on how many replicas wrote it;
* changing ``n`` happens between two inbox items: the replicas' states are taken,
  merged and split again by key (:func:`split_snapshot`) for the new replicas. Every
  key's state goes to the replica its records will go to, exactly.

Pure functions over values; the operator snapshot framing is that of
:meth:`agiledart.operators.base.Operator.snapshot`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import msgpack

from agiledart.app.errors import ExecutionError
from agiledart.app.kinds import KEYED_OPERATORS
from agiledart.dataplane.partition import stable_hash
from agiledart.local.executor import Emission
from agiledart.operators.base import Record

__all__ = [
    "PARTITIONABLE_STATE",
    "combine",
    "merge_snapshots",
    "replica_of",
    "split_records",
    "split_snapshot",
]

#: stateful kinds whose state is a set of per-key entries (and can be split by key)
PARTITIONABLE_STATE = KEYED_OPERATORS


def replica_of(key: Any, n: int) -> int:
    """The replica (of ``n``) that owns ``key``."""
    return (stable_hash(key) >> 32) % n if n > 1 else 0


def split_records(records: list[Record], n: int, field: str | None) -> list[list[Record]]:
    """``records`` over ``n`` replicas: by ``field``'s value, or in contiguous runs."""
    if n <= 1:
        return [records]
    if field is None:
        size, extra = divmod(len(records), n)
        out, start = [], 0
        for i in range(n):
            end = start + size + (1 if i < extra else 0)
            out.append(records[start:end])
            start = end
        return out
    parts: list[list[Record]] = [[] for _ in range(n)]
    for r in records:
        parts[replica_of(r.get(field), n)].append(r)
    return parts


def combine(outs: Sequence[list[Emission]]) -> list[Emission]:
    """The replicas' emissions as one instance's: records (per consumer, in replica
    order) first, then per consumer the lowest watermark the replicas emitted."""
    records: dict[str, list[Record]] = {}
    marks: dict[str, int] = {}
    for out in outs:
        for node, what in out:
            if isinstance(what, list):
                records.setdefault(node, []).extend(what)
            else:
                marks[node] = min(what, marks.get(node, what))
    combined: list[Emission] = [(node, rs) for node, rs in records.items() if rs]
    combined += list(marks.items())
    return combined


# -- state ------------------------------------------------------------------------------

Entries = list[tuple[Any, Any]]  #: (key, what the state holds for it)


def _entries(kind: str, state: Any) -> tuple[Entries, Any]:
    """A state as per-key entries, and what is not per key (kept once)."""
    if kind == "aggregate":
        return [(k, v) for k, v in state], None
    if kind == "dedupe":
        return [(k, ts) for k, ts in state["seen"]], int(state["duplicates"])
    if kind == "window":
        return [(k, (p, acc)) for p, items in state for k, acc in items], None
    if kind == "join":
        return [(k, (s, left, right)) for s, items in state for k, left, right in items], None
    msg = f"the state of a {kind!r} operator cannot be split by key"
    raise ExecutionError(msg)


def _state(kind: str, entries: Entries, rest: Any) -> Any:
    if kind == "aggregate":
        return [[k, v] for k, v in entries]
    if kind == "dedupe":
        return {"seen": [[k, ts] for k, ts in entries], "duplicates": rest or 0}
    grouped: dict[int, list[list[Any]]] = {}
    for k, payload in entries:
        if kind == "window":
            p, acc = payload
            grouped.setdefault(int(p), []).append([k, acc])
        else:
            s, left, right = payload
            grouped.setdefault(int(s), []).append([k, left, right])
    return [[start, items] for start, items in sorted(grouped.items())]


def _unpack(blob: bytes) -> dict[str, Any]:
    snap = msgpack.unpackb(blob, raw=False, strict_map_key=False)
    if not isinstance(snap, dict) or "state" not in snap:
        msg = "not an operator snapshot"
        raise ExecutionError(msg)
    return snap


def _pack(snap: dict[str, Any]) -> bytes:
    return bytes(msgpack.packb(snap, use_bin_type=True))


def merge_snapshots(blobs: Sequence[bytes]) -> bytes:
    """One snapshot holding every key of the replicas' snapshots (disjoint keys)."""
    if len(blobs) == 1:
        return blobs[0]
    snaps = [_unpack(b) for b in blobs]
    kind = str(snaps[0].get("kind"))
    entries: Entries = []
    rest: Any = None
    for snap in snaps:
        more, extra = _entries(kind, snap["state"])
        entries += more
        if extra is not None:
            rest = (rest or 0) + extra
    wms = [min(ws) for ws in zip(*(s["wms"] for s in snaps), strict=True)]
    out_wm = min(int(s.get("out_wm", wms[0] if wms else 0)) for s in snaps)
    return _pack({**snaps[0], "wms": wms, "out_wm": out_wm, "state": _state(kind, entries, rest)})


def split_snapshot(
    blob: bytes, n: int, owner: Callable[[Any, int], int] = replica_of
) -> list[bytes]:
    """``blob`` cut into ``n`` snapshots, each key's entries in ``owner(key, n)``'s;
    what is not per key (a counter) goes to the first."""
    if n == 1:
        return [blob]
    snap = _unpack(blob)
    kind = str(snap.get("kind"))
    entries, rest = _entries(kind, snap["state"])
    parts: list[Entries] = [[] for _ in range(n)]
    for k, payload in entries:
        parts[owner(k, n)].append((k, payload))
    return [
        _pack({**snap, "state": _state(kind, part, rest if i == 0 else None)})
        for i, part in enumerate(parts)
    ]
