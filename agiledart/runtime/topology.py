"""A peer's local topology of an app, pure: which operators run here, chained into
which segments, and which of them may run as several replicas or instances.

Theory of operation: local operators joined by local edges form a *segment*, one task
and one inbox (a union-find over the local edges). A group through which a path leaves
the peer and comes back is split into single operators, so tasks form a DAG like the
app and back-pressure cannot deadlock. An operator with several instances is a segment
of its own: its records arrive partitioned (by key for keyed operators, else in turn).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from agiledart.app.errors import ExecutionError
from agiledart.app.kinds import KEYED_OPERATORS, STATELESS_OPERATORS
from agiledart.app.spec import AppSpec
from agiledart.operators.base import MIN_WATERMARK
from agiledart.runtime.replicas import PARTITIONABLE_STATE

__all__ = [
    "KEYED",
    "STATELESS",
    "LocalTopology",
    "fed",
    "merged_watermark",
    "partition_key",
    "reenters",
    "replicable",
    "segments",
]


def segments(spec: AppSpec, local: set[str], *, alone: set[str]) -> list[list[str]]:
    """Local operators grouped by local edges; a group a path re-enters is split, and
    an operator with several instances (``alone``) is a group of its own."""
    parent = {o: o for o in local}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for o in spec.operators:
        if o.id in local:
            for src in o.inputs:
                if src in local and src not in alone and o.id not in alone:
                    parent[find(src)] = find(o.id)
    groups: dict[str, list[str]] = {}
    for o in spec.operators:  # declaration order within a group
        if o.id in local:
            groups.setdefault(find(o.id), []).append(o.id)
    consumers: dict[str, list[str]] = {}
    for node_id, inputs in fed(spec):
        for src in inputs:
            consumers.setdefault(src, []).append(node_id)
    out: list[list[str]] = []
    for members in groups.values():
        inside = set(members)
        if reenters(inside, consumers):
            out.extend([m] for m in members)
        else:
            out.append(members)
    return out


#: the operator kinds whose state is kept per key, and those without state (the table)
KEYED = KEYED_OPERATORS
STATELESS = STATELESS_OPERATORS


def replicable(spec: AppSpec, ops: list[str], *, chained: bool) -> tuple[bool, str | None]:
    """Whether a segment of ``ops`` may run as several replicas on this peer (one
    operator, on an engine with workers, stateless or with state kept per key), and
    the field that splits its batches (None: contiguous runs)."""
    if chained or len(ops) != 1:
        return False, None
    op = spec.operator(ops[0])
    if op.op in STATELESS:
        return True, None
    key = op.params.get("key")
    if op.op in PARTITIONABLE_STATE and isinstance(key, str):
        return True, key
    return False, None


def partition_key(spec: AppSpec, op_id: str) -> str | None:
    """The field that routes records to instances of ``op_id`` (None: in turn)."""
    op = spec.operator(op_id)
    if op.op in STATELESS:
        return None
    key = op.params.get("key")
    if op.op in KEYED and isinstance(key, str):
        return key
    msg = (
        f"operator {op_id!r} ({op.op}{'' if key else ' without a key'}) cannot run as "
        "several instances: it needs every record"
    )
    raise ExecutionError(msg)


def fed(spec: AppSpec) -> list[tuple[str, tuple[str, ...]]]:
    """``(id, inputs)`` of every operator and sink."""
    return [(o.id, o.inputs) for o in spec.operators] + [(k.id, k.inputs) for k in spec.sinks]


def reenters(inside: set[str], consumers: dict[str, list[str]]) -> bool:
    """Whether some path leaves ``inside`` and comes back into it."""
    seen: set[str] = set()
    stack = [c for n in inside for c in consumers.get(n, ()) if c not in inside]
    while stack:
        n = stack.pop()
        if n in inside:
            return True
        if n in seen:
            continue
        seen.add(n)
        stack.extend(consumers.get(n, ()))
    return False


@dataclass(frozen=True)
class LocalTopology:
    """What of an app runs on peer ``me`` and how it is wired; segments by index.

    Built from the spec and the deployment's hosts alone (no I/O): the instance makes
    one task per segment, one :class:`~agiledart.runtime.edges.OutEdge` per entry of
    :attr:`out_peers`, and routes by :attr:`consumers`, :attr:`groups` and
    :attr:`remote_inputs`."""

    spec: AppSpec
    me: str
    hosts: Mapping[str, tuple[str, ...]]
    local_ops: list[str]
    sources: list[str]  #: local sources
    sinks: list[str]  #: local sinks
    parallel: set[str]  #: nodes with several instances
    partition_key: dict[str, str | None]  #: parallel operator -> the field routing to it
    segments: list[list[str]]  #: operators of each segment
    segment_of: dict[str, int]
    #: local producer -> its local consumers (segments, sinks)
    consumers: dict[str, tuple[list[int], list[str]]]
    #: local producer -> peers hosting its remote consumers (all its records go there)
    out_peers: dict[str, list[str]]
    #: local producer -> partitioned consumers: (consumer, one host per instance; None: here)
    groups: dict[str, list[tuple[str, list[str | None]]]]
    #: producer -> local consumers of its batches from other peers
    remote_inputs: dict[str, tuple[list[int], list[str]]]

    @classmethod
    def of(
        cls, spec: AppSpec, hosts: Mapping[str, tuple[str, ...]], me: str, *, chains: bool
    ) -> LocalTopology:
        here = {n for n, peers in hosts.items() if me in peers}
        local_ops = [o.id for o in spec.operators if o.id in here]
        parallel = {n for n, peers in hosts.items() if len(peers) > 1}
        alone = parallel if chains else set(local_ops)
        groups_of_ops = segments(spec, set(local_ops), alone=alone)
        segment_of = {op: i for i, ops in enumerate(groups_of_ops) for op in ops}
        sources = [s.id for s in spec.sources if s.id in here]
        sinks = [k.id for k in spec.sinks if k.id in here]
        consumers: dict[str, tuple[list[int], list[str]]] = {}
        for ospec in spec.operators:
            into = segment_of.get(ospec.id)
            for src in ospec.inputs:
                if ospec.id in parallel:
                    continue
                if into is not None and segment_of.get(src) != into:
                    segs = consumers.setdefault(src, ([], []))[0]
                    if into not in segs:
                        segs.append(into)
        for k in spec.sinks:
            if k.id in here:
                for src in k.inputs:
                    consumers.setdefault(src, ([], []))[1].append(k.id)
        out_peers: dict[str, list[str]] = {}
        groups: dict[str, list[tuple[str, list[str | None]]]] = {}
        for producer in [*sources, *local_ops]:
            full, shared = _consumer_peers(spec, hosts, me, producer, parallel)
            for peer in [*full, *sorted(p for p in shared if p != me)]:
                out_peers.setdefault(producer, []).append(peer)
            for node_id, inputs in fed(spec):
                if producer in inputs and node_id in parallel:
                    targets = [None if p == me else p for p in hosts[node_id]]
                    groups.setdefault(producer, []).append((node_id, targets))
        remote_inputs = {src: (list(s), list(k)) for src, (s, k) in consumers.items()}
        for ospec in spec.operators:
            if ospec.id in parallel and ospec.id in segment_of:
                for src in ospec.inputs:
                    remote_inputs.setdefault(src, ([], []))[0].append(segment_of[ospec.id])
        return cls(
            spec=spec,
            me=me,
            hosts=hosts,
            local_ops=local_ops,
            sources=sources,
            sinks=sinks,
            parallel=parallel,
            partition_key={n: partition_key(spec, n) for n in parallel},
            segments=groups_of_ops,
            segment_of=segment_of,
            consumers=consumers,
            out_peers=out_peers,
            groups=groups,
            remote_inputs=remote_inputs,
        )

    def channels(self, ops: list[str]) -> list[tuple[str, str]]:
        """The input channels (producer, sending peer) of a segment of ``ops``."""
        spec, hosts = self.spec, self.hosts
        return [
            (p, h)
            for op in ops
            for p in spec.operator(op).inputs
            if p not in ops
            for h in hosts.get(p, ())
        ]

    def sink_channels(self, sink_id: str) -> list[tuple[str, str]]:
        (inputs,) = [k.inputs for k in self.spec.sinks if k.id == sink_id]
        return [(p, h) for p in inputs for h in self.hosts.get(p, ())]

    def leaves(self, op: str, ops: list[str]) -> bool:
        """Whether output of ``op`` leaves the segment of ``ops``."""
        spec = self.spec
        return any(n not in ops for n, inputs in fed(spec) if op in inputs) or any(
            op in k.inputs for k in spec.sinks
        )


def _consumer_peers(
    spec: AppSpec, hosts: Mapping[str, tuple[str, ...]], me: str, producer: str, parallel: set[str]
) -> tuple[list[str], dict[str, str]]:
    """The other peers that get all of ``producer``'s records, and the peers hosting an
    instance of a parallel consumer (peer -> that consumer); both at once is refused."""
    full: list[str] = []
    shared: dict[str, str] = {}
    for node_id, inputs in fed(spec):
        if producer not in inputs:
            continue
        for peer in hosts[node_id]:
            if node_id in parallel:
                shared[peer] = node_id
            elif peer != me and peer not in full:
                full.append(peer)
    both = sorted(set(full) & set(shared))
    if both:
        msg = (
            f"peer {both[0]} hosts an instance of parallel operator "
            f"{shared[both[0]]!r} and another consumer of {producer!r}: give them "
            "separate peers"
        )
        raise ExecutionError(msg)
    return full, shared


def merged_watermark(
    topology: LocalTopology, tracker: dict[str, int], producer: str, sender: str, wm: int
) -> int:
    """The watermark of ``producer`` over all its instances (their minimum); ``tracker``
    keeps each sending peer's latest."""
    if producer not in topology.parallel:
        return wm
    tracker[sender] = max(wm, tracker.get(sender, MIN_WATERMARK))
    return min(tracker.get(h, MIN_WATERMARK) for h in topology.hosts[producer])
