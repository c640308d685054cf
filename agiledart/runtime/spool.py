"""A two-phase sink's store-and-forward buffer (``sql``, ``http``): sealed epochs (or
batches) waiting for the destination, in order, in files on the sink's peer's disk,
at most ``limit`` bytes.

One file per entry, ``<seq>_<epoch>_<rows>.json`` (epoch ``b``: a batch without
checkpoints; ``o``: rows of the epoch not sealed yet, put on disk so that a long epoch
does not fill the memory, renamed to their epoch when it is sealed), written to a
temporary name, fsynced and renamed, so a peer killed mid-write leaves the entry
whole or absent. Entries outlive the peer: a sink reopened
on the restarted peer finds them and sends them on; a network sink keeps its sealed
entries with each checkpoint too (:meth:`Spool.dump`, :meth:`Spool.load_dump`), so
a sink moved to another peer sends them from there. An entry that would pass the
bound is refused (the caller counts its rows as dropped), never written in part.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

__all__ = ["FINAL_EPOCH", "Batch", "Entry", "Spool"]

#: the bookkeeping epoch of a sink's whole output, applied when the app ends
FINAL_EPOCH = -1

#: a spool's entries as one blob (:meth:`Spool.dump`; the class's ``bytes`` is its size)
Dump = bytes

_NAME = re.compile(r"^(\d{12})_(-?\d+|b|o)_(\d+)\.json$")


@dataclass(frozen=True, slots=True)
class Batch:
    """Rows to apply: their ``epoch`` (None: a batch without checkpoints), the
    ``columns`` (name, SQL type; none for an http sink) and the rows (JSON values: for
    an sql sink one value per column, for an http sink a record each)."""

    epoch: int | None
    columns: tuple[tuple[str, str], ...]
    rows: list[Any]


@dataclass(frozen=True, slots=True)
class Entry:
    seq: int
    epoch: int | None  #: None: a batch, or rows of the open epoch
    rows: int
    size: int
    path: Path
    open: bool = False  #: rows of the epoch not sealed yet


class Spool:
    """The entries in ``folder`` (made if missing), oldest first."""

    def __init__(self, folder: Path, limit: int) -> None:
        self.folder = folder
        self.limit = limit
        folder.mkdir(parents=True, exist_ok=True)
        self.entries: list[Entry] = []
        for path in sorted(folder.iterdir()):
            m = _NAME.match(path.name)
            if m is None:  # a temporary file of a write that did not finish
                with contextlib.suppress(OSError):
                    path.unlink()
                continue
            tag = m.group(2)
            epoch = None if tag in ("b", "o") else int(tag)
            size = path.stat().st_size
            seq, rows = int(m.group(1)), int(m.group(3))
            self.entries.append(Entry(seq, epoch, rows, size, path, open=tag == "o"))
        self._next = self.entries[-1].seq + 1 if self.entries else 0
        #: entries are added by one thread and removed by another
        self._lock = threading.Lock()

    @property
    def bytes(self) -> int:
        return sum(e.size for e in self.entries)

    @property
    def rows(self) -> int:
        return sum(e.rows for e in self.entries)

    def append(self, batch: Batch, *, pending: bool = False, limit: bool = True) -> bool:
        """Write ``batch`` as the newest entry (``pending``: rows of the epoch not sealed
        yet); False (nothing written) if it would take the spool past its limit (unless
        ``limit`` is False: entries the limit took once already)."""
        data = json.dumps(
            {"epoch": batch.epoch, "columns": batch.columns, "rows": batch.rows},
            separators=(",", ":"),
            allow_nan=False,
        ).encode("utf-8")
        with self._lock:
            if limit and self.bytes + len(data) > self.limit:
                return False
            seq, self._next = self._next, self._next + 1
        tag = "o" if pending else "b" if batch.epoch is None else str(batch.epoch)
        path = self.folder / f"{seq:012d}_{tag}_{len(batch.rows)}.json"
        tmp = path.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _sync_dir(self.folder)
        with self._lock:
            epoch = None if pending else batch.epoch
            entry = Entry(seq, epoch, len(batch.rows), len(data), path, pending)
            self.entries.append(entry)
        return True

    def seal_open(self, epoch: int) -> None:
        """The open entries become ``epoch``'s."""
        sealed: dict[int, Entry] = {}
        for e in [e for e in self.entries if e.open]:
            path = e.path.with_name(f"{e.seq:012d}_{epoch}_{e.rows}.json")
            os.replace(e.path, path)
            sealed[e.seq] = Entry(e.seq, epoch, e.rows, e.size, path)
        if sealed:
            _sync_dir(self.folder)
            with self._lock:
                self.entries = [sealed.get(e.seq, e) for e in self.entries]

    def load(self, entry: Entry) -> Batch:
        raw: dict[str, Any] = json.loads(entry.path.read_bytes())
        columns = tuple((str(n), str(t)) for n, t in raw["columns"])
        return Batch(entry.epoch, columns, raw["rows"])

    def dump(self, entries: list[Entry]) -> Dump:
        """``entries`` (those delivered meanwhile left out) as one msgpack blob."""
        batches = []
        for entry in entries:
            with contextlib.suppress(FileNotFoundError):  # delivered: not needed
                batches.append([entry.epoch, entry.path.read_bytes()])
        return Dump(msgpack.packb(batches))

    def load_dump(self, blob: Dump, committed: int | None) -> None:
        """Every entry replaced by the entries of ``blob`` (:meth:`dump`) up to epoch
        ``committed``, in their order."""
        self.drop_after(None)
        for epoch, data in msgpack.unpackb(blob):
            if _kept(epoch, committed):
                raw = json.loads(data)
                columns = tuple((str(n), str(t)) for n, t in raw["columns"])
                self.append(Batch(int(epoch), columns, raw["rows"]), limit=False)

    def remove(self, entries: list[Entry]) -> None:
        for entry in entries:
            with contextlib.suppress(FileNotFoundError):
                entry.path.unlink()
        gone = {e.seq for e in entries}
        with self._lock:
            self.entries = [e for e in self.entries if e.seq not in gone]
        _sync_dir(self.folder)

    def drop_after(self, epoch: int | None) -> None:
        """Forget the epochs after ``epoch`` (None: every entry): a restored app
        replays them."""
        self.remove([e for e in self.entries if not _kept(e.epoch, epoch)])


def _kept(entry: int | None, committed: int | None) -> bool:
    """Whether an entry of epoch ``entry`` survives a restore from ``committed``: an
    epoch up to it (not a batch, nor rows of an open epoch, nor the rows after the last
    epoch: FINAL_EPOCH)."""
    return entry is not None and committed is not None and FINAL_EPOCH < entry <= committed


def _sync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
