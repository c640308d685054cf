"""This peer's share of the records store, in memory: bounded, versioned, and dirty-tracked.

Each record has a :data:`~agiledart.runtime.holders.Stamp` (version, value digest); a
write is kept only when its stamp is newer. Set-valued records (written with ``add``)
merge as unions. ``max_value`` bounds one value and ``max_bytes`` the whole share, the
oldest written records going first. Keys changed or evicted are remembered until
:meth:`LocalRecords.drain` hands them to the disk (:mod:`agiledart.runtime.recordfiles`).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import msgpack

from agiledart.runtime.errors import StoreError
from agiledart.runtime.holders import Stamp, digest_of

__all__ = ["LocalRecords"]


@dataclass(slots=True)
class _Item:
    version: int
    value: Any
    size: int
    digest: bytes
    merge: bool  #: a set written with ``add``: copies merge as unions

    @property
    def stamp(self) -> Stamp:
        return (self.version, self.digest)


class LocalRecords:
    """This peer's share of the records: ``key -> (version, value)``, bounded."""

    def __init__(self, *, max_value: int = 8 << 20, max_bytes: int = 64 << 20) -> None:
        self.max_value = max_value
        self.max_bytes = max_bytes
        self._items: OrderedDict[int, _Item] = OrderedDict()
        self._bytes = 0
        #: keys changed or evicted since :meth:`drain` (what the disk must catch up on)
        self.dirty: set[int] = set()

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    @property
    def bytes(self) -> int:
        """Encoded size of everything held."""
        return self._bytes

    def stamps(self) -> list[tuple[int, Stamp]]:
        """``(key, stamp)`` of every record held, oldest written first."""
        return [(k, item.stamp) for k, item in self._items.items()]

    def get(self, key: int) -> tuple[int, Any] | None:
        item = self._items.get(key)
        return None if item is None else (item.version, item.value)

    def item(self, key: int) -> _Item | None:
        return self._items.get(key)

    def stamp(self, key: int) -> Stamp | None:
        item = self._items.get(key)
        return None if item is None else item.stamp

    def put(self, key: int, version: int, value: Any, *, merge: bool = False) -> bool:
        """Keep ``value`` if its stamp is newer than what is stored; whether it was kept."""
        packed = msgpack.packb(value, use_bin_type=True)
        if len(packed) > self.max_value:
            msg = f"record of {len(packed)} bytes exceeds the limit of {self.max_value}"
            raise StoreError(msg)
        item = _Item(version, value, len(packed), digest_of(value, merge=merge), merge)
        old = self._items.get(key)
        if old is not None and old.stamp >= item.stamp:
            return False
        if old is not None:
            self._bytes -= old.size
            del self._items[key]
        self._items[key] = item
        self._bytes += item.size
        self.dirty.add(key)
        while self._bytes > self.max_bytes and len(self._items) > 1:
            evicted, gone = self._items.popitem(last=False)
            self._bytes -= gone.size
            self.dirty.add(evicted)
        return True

    def add(self, key: int, version: int, members: list[Any]) -> list[Any]:
        """Merge ``members`` into the set-valued record at ``key``; the merged set."""
        old = self._items.get(key)
        current = list(old.value) if old is not None and isinstance(old.value, list) else []
        new = [m for m in members if m not in current]
        if old is not None and old.merge and not new:
            return current
        merged = current + new
        self.put(key, max(version, (old.version + 1) if old else version), merged, merge=True)
        return merged

    def drain(self) -> tuple[list[tuple[int, int, bool, Any]], list[int]]:
        """The records to write and the keys to delete since the last drain."""
        writes, deletes = [], []
        for key in sorted(self.dirty):
            item = self._items.get(key)
            if item is None:
                deletes.append(key)
            else:
                writes.append((key, item.version, item.merge, item.value))
        self.dirty.clear()
        return writes, deletes
