"""Top-k records per tumbling event-time window, by a numeric field.

Theory of operation. Records fall into windows ``[start, start + window_ms)``; when
the watermark passes a window's end it emits
``{"window_start", "window_end", "top": [k records, best first], "ts": window_end - 1}``.
"Best" is a total order, so results do not depend on arrival order: larger ``by``
first, then smaller ``ts``, then the record's canonical JSON text (sorted keys). Each
window keeps at most ``max(4k, 64)`` candidates between prunes (memory O(k) per
window); after a prune, records strictly worse on ``by`` than the k-th candidate are
dropped on arrival. Late records are counted and dropped; windows with no records emit
nothing.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

from agiledart.app.errors import OperatorError
from agiledart.operators.base import Operator, Record

__all__ = ["TopK", "rank"]

_NUMBERS = (int, float)


def rank(record: Record, by: str) -> tuple[Any, Any, str]:
    """Sort key, smallest best: ``(-by, ts, canonical json)``."""
    return (
        -record[by],
        record["ts"],
        json.dumps(record, sort_keys=True, separators=(",", ":"), default=repr),
    )


class TopK(Operator):
    kind: ClassVar[str] = "top_k"
    stateful: ClassVar[bool] = True

    def __init__(self, *, k: int, by: str, window_ms: int, state: bytes | None = None) -> None:
        super().__init__()
        if k <= 0 or window_ms <= 0:
            msg = f"top_k needs k > 0 and window_ms > 0, got k={k}, window_ms={window_ms}"
            raise OperatorError(msg)
        self.k, self.by, self.window_ms = k, by, window_ms
        self._limit = max(4 * k, 64)
        #: window start -> [(rank, record)]
        self._windows: dict[int, list[tuple[tuple[Any, Any, str], Record]]] = {}
        #: window start -> -by of its k-th best candidate after the last prune
        self._cutoff: dict[int, Any] = {}
        if state is not None:
            self.restore(state)

    def on_batch(self, input_index: int, records: list[Record]) -> list[Record]:
        wm, w, by, windows, cutoffs = self._wm, self.window_ms, self.by, self._windows, self._cutoff
        late = 0
        for r in records:
            try:
                ts = r["ts"]
                if ts < wm:
                    late += 1
                    continue
                v = r[by]
                if not isinstance(v, _NUMBERS) or v is True or v is False:
                    raise TypeError(f"field {by!r} is not a number: {v!r}")  # noqa: EM102
                s = ts - ts % w
                cut = cutoffs.get(s)
                if cut is not None and -v > cut:
                    continue  # worse than k records already held: cannot make the top k
                cands = windows.get(s)
                if cands is None:
                    cands = windows[s] = []
                cands.append((rank(r, by), r))
                if len(cands) > self._limit:
                    cands.sort(key=_first)
                    del cands[self.k :]
                    cutoffs[s] = cands[-1][0][0]
            except (KeyError, TypeError) as e:
                self._bad(e, r)
        self.stats.records_in += len(records)
        self.stats.late += late
        return []

    def _advance(self, prev: int, wm: int) -> list[Record]:
        w = self.window_ms
        out: list[Record] = []
        for s in sorted(s for s in self._windows if s + w <= wm):
            cands = self._windows.pop(s)
            self._cutoff.pop(s, None)
            cands.sort(key=_first)
            top = [r for _, r in cands[: self.k]]
            out.append({"window_start": s, "window_end": s + w, "top": top, "ts": s + w - 1})
        return out

    def _state(self) -> Any:
        return [[s, [r for _, r in cands]] for s, cands in self._windows.items()]

    def _load(self, state: Any) -> None:
        self._windows = {int(s): [(rank(r, self.by), r) for r in recs] for s, recs in state}
        self._cutoff = {}


def _first(item: tuple[tuple[Any, Any, str], Record]) -> tuple[Any, Any, str]:
    return item[0]
