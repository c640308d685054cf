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

__all__ = ["app_graph", "changes"]


def app_graph(spec: Any, status: Mapping[str, Any]) -> dict[str, Any]:
    """``{"nodes": [...], "edges": [[from, to], ...]}`` of an app; empty if unreadable."""
    if not isinstance(spec, Mapping):
        return {"nodes": [], "edges": []}
    placement = _mapping(status.get("placement"))
    pinned = {**_mapping(status.get("sources")), **_mapping(status.get("sinks"))}
    loads = _loads(_mapping(status.get("peers")))
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


def changes(before: Mapping[str, Any] | None, after: Mapping[str, Any]) -> list[str]:
    """What differs between two cluster views (``{"peers": {name: reachable}, "apps":
    {app_id: (name, state)}}``), in words."""
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
    for app_id in sorted(apps_now):
        name, state = apps_now[app_id]
        if app_id not in apps_was:
            out.append(f"app {app_id} ({name}) is {state}")
        elif apps_was[app_id][1] != state:
            out.append(f"app {app_id} ({name}): {apps_was[app_id][1]} -> {state}")
    return out
