"""Drop records whose key was already seen within ``ttl_ms`` of event time.

Theory of operation. For each key the operator remembers the ``ts`` of the last record
it let through. A record passes (and becomes the remembered one) unless
``|ts - remembered| < ttl_ms``; so of retransmitted copies only the first to arrive is
kept. A key is forgotten once the watermark reaches ``remembered + ttl_ms``: any record
that can still arrive has ``ts >= wm`` and could not be a duplicate of it, so memory is
bounded by the keys seen in the last ``ttl_ms`` plus the out-of-orderness, and the
result does not depend on when the watermark moved. Records behind the watermark are
late: counted and dropped. Output order is arrival order; the watermark passes through.
"""

from __future__ import annotations

import heapq
from typing import Any, ClassVar

from agiledart.app.errors import OperatorError
from agiledart.operators.base import Operator, Record

__all__ = ["Dedupe"]


class Dedupe(Operator):
    kind: ClassVar[str] = "dedupe"
    stateful: ClassVar[bool] = True

    def __init__(self, *, key: str, ttl_ms: int, state: bytes | None = None) -> None:
        super().__init__()
        if ttl_ms <= 0:
            msg = f"dedupe needs ttl_ms > 0, got {ttl_ms}"
            raise OperatorError(msg)
        self.key, self.ttl_ms = key, ttl_ms
        self.duplicates = 0
        self._seen: dict[Any, int] = {}
        #: (expiry, sequence, key); stale entries are skipped when popped
        self._expiry: list[tuple[int, int, Any]] = []
        self._seq = 0
        if state is not None:
            self.restore(state)

    def on_batch(self, input_index: int, records: list[Record]) -> list[Record]:
        wm, ttl, key, seen = self._wm, self.ttl_ms, self.key, self._seen
        out: list[Record] = []
        late = dups = 0
        for r in records:
            try:
                ts = r["ts"]
                if ts < wm:
                    late += 1
                    continue
                k = r[key]
                last = seen.get(k)
                if last is not None and -ttl < ts - last < ttl:
                    dups += 1
                    continue
                seen[k] = ts
                self._seq += 1
                heapq.heappush(self._expiry, (ts + ttl, self._seq, k))
                out.append(r)
            except (KeyError, TypeError) as e:
                self._bad(e, r)
        st = self.stats
        st.records_in += len(records)
        st.records_out += len(out)
        st.late += late
        self.duplicates += dups
        return out

    def _advance(self, prev: int, wm: int) -> list[Record]:
        heap, seen, ttl = self._expiry, self._seen, self.ttl_ms
        while heap and heap[0][0] <= wm:
            _, _, k = heapq.heappop(heap)
            last = seen.get(k)
            if last is not None and last + ttl <= wm:
                del seen[k]
        return []

    def _state(self) -> Any:
        return {"seen": list(self._seen.items()), "duplicates": self.duplicates}

    def _load(self, state: Any) -> None:
        self._seen = {k: int(ts) for k, ts in state["seen"]}
        self.duplicates = int(state["duplicates"])
        self._seq = 0
        self._expiry = []
        for k, ts in self._seen.items():
            self._seq += 1
            self._expiry.append((ts + self.ttl_ms, self._seq, k))
        heapq.heapify(self._expiry)
