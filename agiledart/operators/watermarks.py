"""Source-side watermarks with bounded out-of-orderness.

A source that knows its records arrive at most ``max_out_of_order_ms`` behind the
largest ``ts`` seen so far emits the watermark ``max_ts - max_out_of_order_ms`` after
each batch: no record with a smaller ``ts`` should follow. A finite source ends with
:data:`~agiledart.operators.base.FINAL_WATERMARK`.
"""

from __future__ import annotations

from operator import itemgetter

from agiledart.app.errors import OperatorError
from agiledart.operators.base import FINAL_WATERMARK, MIN_WATERMARK, Record

__all__ = ["BoundedOutOfOrderness"]

_TS = itemgetter("ts")


class BoundedOutOfOrderness:
    def __init__(self, max_out_of_order_ms: int) -> None:
        if max_out_of_order_ms < 0:
            msg = f"max_out_of_order_ms must be >= 0, got {max_out_of_order_ms}"
            raise OperatorError(msg)
        self.lag = max_out_of_order_ms
        self.max_ts = MIN_WATERMARK
        self.watermark = MIN_WATERMARK

    def observe(self, records: list[Record]) -> int | None:
        """Account for a batch; the new watermark if it advanced, else None."""
        if not records:
            return None
        try:
            top = max(map(_TS, records))
        except (KeyError, TypeError):
            top = max((r["ts"] for r in records if isinstance(r.get("ts"), int)), default=None)
            if top is None:
                return None
        return self.observe_ts(top)

    def observe_ts(self, max_ts: int) -> int | None:
        if max_ts > self.max_ts:
            self.max_ts = max_ts
        wm = self.max_ts - self.lag
        if wm > self.watermark:
            self.watermark = wm
            return wm
        return None

    def finish(self) -> int:
        """The final watermark, closing every window downstream."""
        self.watermark = FINAL_WATERMARK
        return FINAL_WATERMARK
