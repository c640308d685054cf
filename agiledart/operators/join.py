"""Windowed equi-join of two inputs on a key field.

Theory of operation. Both inputs are cut into the same tumbling event-time windows
``[start, start + window_ms)``; a left and a right record match when they carry the
same ``key`` value and fall into the same window. When the watermark (the minimum of
the two inputs') passes a window's end, its matches are emitted in
``(window_end, key, left arrival, right arrival)`` order as
``{"key", "left", "right", "ts"}`` where ``ts = max(left.ts, right.ts)``: the time by
which both sides had happened. Those ``ts`` can be as early as the window's start, so
the output watermark is held back to the start of the window the watermark is in
(``wm - wm % window_ms``); the final watermark passes through. Late records (below the
watermark) are counted and dropped.
"""

from __future__ import annotations

from typing import Any, ClassVar

from agiledart.app.errors import OperatorError
from agiledart.operators.base import FINAL_WATERMARK, Operator, Record, order_key

__all__ = ["Join"]


class Join(Operator):
    kind: ClassVar[str] = "join"
    stateful: ClassVar[bool] = True

    def __init__(self, *, key: str, window_ms: int, state: bytes | None = None) -> None:
        super().__init__(inputs=2)
        if window_ms <= 0:
            msg = f"join needs window_ms > 0, got {window_ms}"
            raise OperatorError(msg)
        self.key, self.window_ms = key, window_ms
        #: window start -> {key: ([left records], [right records])}
        self._windows: dict[int, dict[Any, tuple[list[Record], list[Record]]]] = {}
        if state is not None:
            self.restore(state)

    def on_batch(self, input_index: int, records: list[Record]) -> list[Record]:
        if input_index not in (0, 1):
            msg = f"join has inputs 0 (left) and 1 (right), got {input_index}"
            raise OperatorError(msg)
        wm, w, key, windows = self._wm, self.window_ms, self.key, self._windows
        late = 0
        for r in records:
            try:
                ts = r["ts"]
                if ts < wm:
                    late += 1
                    continue
                k = r[key]
                s = ts - ts % w
                win = windows.get(s)
                if win is None:
                    win = windows[s] = {}
                sides = win.get(k)
                if sides is None:
                    sides = win[k] = ([], [])
                sides[input_index].append(r)
            except (KeyError, TypeError) as e:
                self._bad(e, r)
        self.stats.records_in += len(records)
        self.stats.late += late
        return []

    def _advance(self, prev: int, wm: int) -> list[Record]:
        w = self.window_ms
        out: list[Record] = []
        for s in sorted(s for s in self._windows if s + w <= wm):
            win = self._windows.pop(s)
            for k in sorted(win, key=order_key):
                left, right = win[k]
                for lr in left:
                    lts = lr["ts"]
                    for rr in right:
                        rts = rr["ts"]
                        out.append(
                            {"key": k, "left": lr, "right": rr, "ts": lts if lts > rts else rts}
                        )
        return out

    def _output_watermark(self, wm: int) -> int:
        return wm if wm == FINAL_WATERMARK else wm - wm % self.window_ms

    def _state(self) -> Any:
        return [
            [s, [[k, left, right] for k, (left, right) in win.items()]]
            for s, win in self._windows.items()
        ]

    def _load(self, state: Any) -> None:
        self._windows = {
            int(s): {k: (list(left), list(right)) for k, left, right in items} for s, items in state
        }
