"""What the dashboard draws, as plain values: an app's dataflow graph and the ring's events.

:func:`app_graph` turns an app record's spec (as stored in the records store) and its
``status`` answer into nodes (sources, operators, sinks, each with the peers hosting it,
its layer from the sources and its live load) and edges; the page lays the layers out
left to right. :func:`changes` compares two cluster views and names what happened in
between (peers appearing and going silent, apps changing state), for the event list.
Pure functions over dicts: a malformed record gives an empty graph, never an error.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["app_graph", "changes", "incidents"]


def app_graph(spec: Any, status: Mapping[str, Any]) -> dict[str, Any]:
    """``{"nodes": [...], "edges": [[from, to], ...]}`` of an app; empty if unreadable."""
    if not isinstance(spec, Mapping):
        return {"nodes": [], "edges": []}
    placement = _mapping(status.get("placement"))
    pinned = {**_mapping(status.get("sources")), **_mapping(status.get("sinks"))}
    loads = _loads(_mapping(status.get("peers")))
    if status.get("state") in ("finished", "failed", "stopped"):  # nothing moves any more
        loads = {op: {**load, "rate": 0.0, "queued": 0.0} for op, load in loads.items()}
    nodes: list[dict[str, Any]] = []
    inputs: dict[str, list[str]] = {}
    for kind, key in (("source", "sources"), ("operator", "operators"), ("sink", "sinks")):
        for raw in spec.get(key) or ():
            if not isinstance(raw, Mapping) or not isinstance(raw.get("id"), str):
                continue
            node_id = raw["id"]
            ins = [i for i in raw.get("inputs") or () if isinstance(i, str)]
            inputs[node_id] = ins
            peers = placement.get(node_id) if kind == "operator" else [pinned.get(node_id)]
            nodes.append(
                {
                    "id": node_id,
                    "kind": kind,
                    "op": str(raw.get("op") or raw.get("connector") or ""),
                    "peers": [p for p in peers or () if isinstance(p, str)],
                    "load": loads.get(node_id),
                }
            )
    known = set(inputs)
    edges = [[src, dst] for dst, ins in inputs.items() for src in ins if src in known]
    layers = _layers(inputs)
    for node in nodes:
        node["layer"] = layers.get(node["id"], 0)
    return {"nodes": nodes, "edges": edges}


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _loads(peers: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """Per operator over its instances: input rate and queue summed, utilization's max."""
    out: dict[str, dict[str, float]] = {}
    for stats in peers.values():
        for op_id, s in _mapping(_mapping(stats).get("operators")).items():
            if not isinstance(s, Mapping):
                continue
            load = out.setdefault(op_id, {"rate": 0.0, "queued": 0.0, "utilization": 0.0})
            load["rate"] += _number(s.get("rate"))
            load["queued"] += _number(s.get("queued"))
            load["utilization"] = max(load["utilization"], _number(s.get("utilization")))
    return out


def _number(value: Any) -> float:
    return float(value) if isinstance(value, int | float) else 0.0


def _layers(inputs: Mapping[str, list[str]]) -> dict[str, int]:
    """Longest distance from a source, iteratively (a cycle, invalid anyway, stops)."""
    layer = {n: 0 for n in inputs}
    for _ in range(len(inputs)):
        changed = False
        for node, ins in inputs.items():
            want = max((layer[i] + 1 for i in ins if i in layer), default=0)
            if want > layer[node]:
                layer[node], changed = want, True
        if not changed:
            break
    return layer


def incidents(status: Mapping[str, Any]) -> dict[str, Any]:
    """What of an app's ``status`` the event list follows: its recoveries and rescales,
    the records its operators dropped by errors (and the most frequent error), its error."""
    problems = _mapping(status.get("problems"))
    recent = [e for p in problems.values() for e in _mapping(p).get("recent") or ()]
    top = max(recent, key=lambda e: _number(_mapping(e).get("count")), default=None)
    return {
        "recoveries": [r for r in status.get("recoveries") or () if isinstance(r, Mapping)],
        "rescales": [r for r in status.get("rescales") or () if isinstance(r, Mapping)],
        "errors": int(_number(_mapping(status.get("totals")).get("errors"))),
        "top_error": None
        if not isinstance(top, Mapping)
        else f"{top.get('type')}: {top.get('message')}",
        "error": status.get("error"),
    }


def changes(before: Mapping[str, Any] | None, after: Mapping[str, Any]) -> list[str]:
    """What differs between two cluster views (``{"peers": {name: reachable}, "apps":
    {app_id: (name, state)}, "incidents": {app_id: incidents(status)}}``), in words."""
    if before is None:
        return []
    out: list[str] = []
    was, now = _mapping(before.get("peers")), _mapping(after.get("peers"))
    for name in sorted(set(now) - set(was)):
        out.append(f"peer {name} appeared")
    for name in sorted(set(was) - set(now)):
        out.append(f"peer {name} is no longer known")
    for name in sorted(set(was) & set(now)):
        if was[name] and not now[name]:
            out.append(f"peer {name} stopped answering")
        elif now[name] and not was[name]:
            out.append(f"peer {name} answers again")
    apps_was, apps_now = _mapping(before.get("apps")), _mapping(after.get("apps"))
    inc_was, inc_now = _mapping(before.get("incidents")), _mapping(after.get("incidents"))
    for app_id in sorted(apps_now):
        name, state = apps_now[app_id]
        now_inc = _mapping(inc_now.get(app_id))
        if app_id not in apps_was:
            out.append(f"app {app_id} ({name}) is {state}")
            continue
        was_inc = _mapping(inc_was.get(app_id))
        for event in list(now_inc.get("recoveries") or ())[len(was_inc.get("recoveries") or ()) :]:
            out.append(f"app {app_id}: {_recovery(event)}")
        for event in list(now_inc.get("rescales") or ())[len(was_inc.get("rescales") or ()) :]:
            ops = ", ".join(event.get("operators") or ())
            out.append(
                f"app {app_id}: {event.get('action')} of {ops} from {event.get('from')} "
                f"to {event.get('to') or '-'}"
            )
        errors = int(_number(now_inc.get("errors")))
        if errors > int(_number(was_inc.get("errors"))):
            top = now_inc.get("top_error")
            out.append(
                f"app {app_id}: {errors} record(s) dropped by errors" + (f" ({top})" if top else "")
            )
        if apps_was[app_id][1] != state:
            why = now_inc.get("error") if state == "failed" else None
            out.append(
                f"app {app_id} ({name}): {apps_was[app_id][1]} -> {state}"
                + (f": {why}" if why else "")
            )
    return out


def _recovery(event: Mapping[str, Any]) -> str:
    ops = ", ".join(event.get("operators") or ()) or "its part"
    if event.get("restarted"):
        what = f"{event.get('dead')} restarted and kept {ops}"
    else:
        dead, by = event.get("dead"), event.get("takeover")
        what = f"recovered from the loss of {dead} ({by} took over {ops})"
    epoch = (
        f", from checkpoint epoch {event.get('epoch')}" if event.get("mode") == "checkpoint" else ""
    )
    return what + epoch
