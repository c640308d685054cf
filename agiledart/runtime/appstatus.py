"""The views of apps a scheduler answers with: ``status --json`` (the record's fields
and totals over the hosting peers' statistics) and the ``apps`` listing."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import time
from collections.abc import Mapping
from typing import Any

from agiledart.operators.base import RECENT_ERRORS, OperatorStats
from agiledart.runtime.appstate import AppRecord, apps_index, utc_day
from agiledart.runtime.errors import UnknownApp
from agiledart.runtime.metrics import quantile
from agiledart.runtime.records import Records, record_key

__all__ = ["list_apps", "merged_operator", "status_view"]

#: an operator's counters that add up over its instances on several peers (a
#: scaled-out stateless operator runs on more than one)
_ADDED = frozenset(
    {"records_in", "records_out", "late", "errors", "dead_letters", "instances", "queued"}
    | {"queued_batches", "rate"}
)


def status_view(rec: AppRecord, stats: dict[str, Any]) -> dict[str, Any]:
    """The ``status --json`` object: record fields plus totals over the peers' stats."""
    sources: dict[str, Any] = {}
    sinks: dict[str, Any] = {}
    operators: dict[str, Any] = {}
    uptime = 0.0
    for peer_stats in stats.values():
        if not isinstance(peer_stats, dict):
            continue
        uptime = max(uptime, float(peer_stats.get("uptime_s", 0.0)))
        sources.update(peer_stats.get("sources", {}))
        sinks.update(peer_stats.get("sinks", {}))
        for name, op in (peer_stats.get("operators") or {}).items():
            if isinstance(op, dict):
                operators[name] = merged_operator(operators.get(name), op)
    problems = problems_of(stats)
    emitted = sum(s.get("emitted", 0) for s in sources.values())
    # recent end-to-end latencies of every sink, merged (then dropped from the peers' part)
    recent = sorted(x for s in sinks.values() for x in s.get("latency_recent_ms", ()))
    paths = list(dict.fromkeys(tuple(p) for p in rec.paths))
    return {
        "app_id": rec.app_id,
        "name": rec.name,
        "state": rec.state.value,
        "error": rec.error,
        "scheduler": rec.scheduler_name,
        "placement": rec.placement,
        "strategy": rec.strategy,
        "sources": rec.sources,
        "sinks": rec.sinks,
        "paths": [list(p) for p in paths],
        "generation": rec.generation,
        "recoveries": rec.recoveries,
        "checkpoint": None
        if rec.checkpoint is None
        else {
            **{k: rec.checkpoint[k] for k in ("epoch", "bytes", "store_s", "cut_s", "at")},
            "waited_s": rec.checkpoint.get("waited_s", 0.0),  # older records lack it
        },
        "problems": problems,
        "checkpoints": rec.checkpoints,
        "checkpoint_failures": rec.checkpoint_failures,
        "checkpoint_error": rec.checkpoint_error,
        "scaling": _scaling_view(stats),
        "rescales": rec.rescales,
        "totals": {
            "source_records": emitted,
            "sink_records": sum(s.get("records", 0) for s in sinks.values()),
            "delayed": sum(s.get("delayed", 0) for s in sources.values()),
            "shed": sum(s.get("shed", 0) for s in sources.values()),
            "late": sum(o.get("late", 0) for o in operators.values()),
            "errors": sum(p["errors"] for p in problems.values())
            + sum(s.get("errors", 0) for s in sinks.values()),
            "dropped": sum(s.get("dropped", 0) for s in sinks.values()),
            "source_rate": round(emitted / uptime, 1) if uptime > 0 else 0.0,
            "latency_p50_ms": quantile(recent, 0.5),
            "latency_p99_ms": quantile(recent, 0.99),
            "latency_samples": len(recent),
        },
        "peers": _without_samples(stats),
    }


def merged_operator(seen: dict[str, Any] | None, more: dict[str, Any]) -> dict[str, Any]:
    """One operator's statistics over the peers that run it: ``seen`` (the peers read
    so far; None: none) with ``more`` (one more peer's). Counters add up, recent errors
    merge by type and message; a measure of one instance (health, busy, wait) is the
    busiest instance's."""
    if seen is None:
        return dict(more)
    out = dict(seen if _busy(seen) >= _busy(more) else more)
    for key in _ADDED & (seen.keys() | more.keys()):
        out[key] = _number(seen.get(key)) + _number(more.get(key))
    errors = OperatorStats()
    for error in [*seen.get("recent_errors", ()), *more.get("recent_errors", ())]:
        if isinstance(error, dict) and {"type", "message"} <= error.keys():
            errors.note_error(error)
    if errors.recent_errors:
        out["recent_errors"] = errors.recent_errors
    return out


def _number(value: object) -> float | int:
    return value if isinstance(value, int | float) and not isinstance(value, bool) else 0


def _busy(op: dict[str, Any]) -> float:
    return float(_number(op.get("utilization")))


def problems_of(stats: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per operator with errors (or a dead-letter sink in trouble), over every peer
    running it: how many records it dropped, and its recent distinct errors (type,
    message, a record that raised it, the peer, how often), the most frequent first;
    with ``on_error: dead_letter`` also the letters written and each peer's sink."""
    out: dict[str, dict[str, Any]] = {}
    for peer, peer_stats in stats.items():
        if not isinstance(peer_stats, dict):
            continue
        for op, st in (peer_stats.get("operators") or {}).items():
            if not isinstance(st, dict):
                continue
            errors = int(st.get("errors", 0))
            letters = st.get("dead_letter_sink")
            letters = letters if isinstance(letters, dict) else None
            if not errors and not (letters and letters.get("problem")):
                continue
            view = out.setdefault(op, {"errors": 0, "recent": []})
            view["errors"] += errors
            view["recent"].extend(e for e in st.get("recent_errors", ()) if isinstance(e, dict))
            if letters is not None:
                view["dead_letters"] = view.get("dead_letters", 0) + int(st.get("dead_letters", 0))
                view.setdefault("dead_letter_sinks", {})[peer] = letters
    for view in out.values():
        view["recent"].sort(key=lambda e: -int(e.get("count", 1)))
        del view["recent"][RECENT_ERRORS:]
    return out


def _scaling_view(stats: dict[str, Any]) -> dict[str, Any]:
    """Per operator (group): its instances in all (summed over its peers) and each
    hosting peer's controller view (agiledart.runtime.scaling)."""
    out: dict[str, Any] = {}
    for peer, peer_stats in sorted(stats.items()):
        scaling = peer_stats.get("scaling") if isinstance(peer_stats, dict) else None
        if not isinstance(scaling, dict):
            continue
        for op, view in scaling.items():
            if not isinstance(view, dict):
                continue
            entry = out.setdefault(op, {"instances": 0, "peers": {}})
            entry["instances"] += int(view.get("instances", 1))
            entry["peers"][peer] = view
    return out


def _without_samples(stats: dict[str, Any]) -> dict[str, Any]:
    """A copy of the peers' statistics without the raw latency samples (merged above)."""
    out: dict[str, Any] = {}
    for peer, peer_stats in stats.items():
        if isinstance(peer_stats, dict) and isinstance(peer_stats.get("sinks"), dict):
            sinks = {
                k: {f: v for f, v in s.items() if f != "latency_recent_ms"}
                if isinstance(s, dict)
                else s
                for k, s in peer_stats["sinks"].items()
            }
            peer_stats = {**peer_stats, "sinks": sinks}
        out[peer] = peer_stats
    return out


async def list_apps(
    records: Records, held: Mapping[str, AppRecord], *, days: int, limit: int
) -> list[dict[str, Any]]:
    """The apps submitted in the last ``days`` days (UTC), newest first, at most
    ``limit`` of them; each record is read from the DHT (those ``held`` here from memory)."""
    today = utc_day(time.time())
    keys = [apps_index(today - datetime.timedelta(days=d)) for d in range(days)]
    indices = await asyncio.gather(*(records.get(k) for k in keys))
    ids: list[Any] = []
    for index in indices:  # newest day first, newest app first within a day
        ids.extend(reversed(index) if isinstance(index, list) else ())
    ids = list(dict.fromkeys(ids))[:limit]
    limiter = asyncio.Semaphore(32)  # thousands of apps: a few dozen lookups at a time

    async def get(app_id: Any) -> Any:
        if str(app_id) in held:
            return None  # ours: the record is in memory
        async with limiter:
            return await records.get(record_key("app", str(app_id)))

    recs = await asyncio.gather(*(get(i) for i in ids), return_exceptions=True)
    out = []
    for app_id, raw in zip(ids, recs, strict=True):
        rec = held.get(str(app_id))
        if rec is None and not isinstance(raw, BaseException) and raw is not None:
            with contextlib.suppress(UnknownApp):  # a malformed record: unknown
                rec = AppRecord.from_wire(raw)
        if rec is None:
            out.append({"app_id": app_id, "name": "?", "state": "unknown"})
            continue
        out.append(
            {
                "app_id": rec.app_id,
                "name": rec.name,
                "state": rec.state.value,
                "scheduler": rec.scheduler_name,
                "submitted_at": rec.submitted_at,
            }
        )
    return out
