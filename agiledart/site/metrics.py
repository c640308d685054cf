"""Prometheus metrics of one peer (``agiledart peer --metrics-port P``, ``GET /metrics``).

Nothing on the hot path is instrumented for this: :class:`PeerCollector` reads the
peer's live state when Prometheus scrapes (the ``ring`` answer's sources: overlay and
frame counters, each app instance's ``statistics()``, the engine's info) and turns it
into metric families. The one exception is the end-to-end latency histogram, which the
sinks fill as they compute latencies (:class:`~agiledart.runtime.metrics.LatencyHistogram`;
only the ~5% traced records are measured).

Every series carries ``peer`` (the peer's name). Families, all prefixed ``agiledart_``:

=============================================  =========================================
operator_tuples_in_total / _out_total           per operator instance (app, operator, op)
operator_tuples_dropped_total{reason}           late (behind the watermark) or error
operator_queue_tuples / operator_queue_batches  waiting in the instance's inbox now
operator_input_rate / operator_utilization      records/s and rho over the last 10 s
operator_busy_ratio / operator_service_seconds  share of time executing; cost per record
operator_instances                              instances of the operator in the app
source_tuples_total{outcome}, sink_tuples_total, sink_dropped_total, edge_tuples_total
app_latency_seconds                             histogram: source to sink, per app
apps_hosted, records_store_entries / _bytes, engine_workers, engine_migrations_total
ring_peers_known, leaf_set_size, overlay_events_total{event}, overlay_route_hops
messages_rejected_total{transport, reason}      bad MAC, replay, oversize, malformed...
frames_total{direction}, frame_bytes_total{direction}, frame_connections
checkpoint_size_bytes, checkpoint_duration_seconds, checkpoint_failures_total,
recoveries_total
process_tree_resident_bytes, process_tree_cpu_seconds_total, process_tree_processes
=============================================  =========================================

Access and cost: the endpoint listens on a loopback address unless the peer is told
otherwise (``--metrics-host``; :class:`~agiledart.site.Site`), and with a token
(``--metrics-token-file`` or ``$AGILEDART_METRICS_TOKEN``; required beyond loopback) it
answers only ``Authorization: Bearer TOKEN`` (401 without, 403 with a wrong one). A
scrape reads the peer's live state on the event loop (plain attribute reads, bounded by
the app cap) and does the rest in a thread: the process tree's usage (psutil walks
``/proc``) before, the text encoding after. Scrapes are rendered one at a time and one
answer serves every scrape within ``min_interval_s`` of it, so a crowd of scrapers costs
the peer one render per interval.

Not there yet, on purpose: the operators' *health score* f(x) of the scaling issue
(paper §IV-C) does not exist; it will be computed from the input rate and the queue
exported here (``operator_input_rate``, ``operator_queue_tuples``, with
``operator_utilization`` as the nearest measure today) and exported as
``agiledart_operator_health`` when it does. The checkpoint and recovery families exist
so that dashboards and alerts can be written now, but no checkpoints are taken yet:
they stay at zero until the recovery subsystem runs over the network.
"""

from __future__ import annotations

import asyncio
import hmac
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import psutil
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from agiledart import __version__
from agiledart.runtime.metrics import LatencyHistogram
from agiledart.site.http import Request, Response

if TYPE_CHECKING:
    from agiledart.peer import Peer

__all__ = ["MetricsEndpoint", "PeerCollector", "metrics_handler", "process_tree_usage"]

P = "agiledart_"
#: checkpoint sizes (bytes) and durations (s) bucket bounds, for when there are any


def process_tree_usage(proc: psutil.Process) -> tuple[int, float, int]:
    """(resident bytes, CPU seconds, processes) of ``proc`` and its live descendants.

    CPU seconds include children already reaped (the kernel adds them to the parent's
    ``children_*`` times), so the figure only grows, as a counter must.
    """
    t = proc.cpu_times()
    cpu = t.user + t.system + t.children_user + t.children_system
    rss, count = proc.memory_info().rss, 1
    for child in proc.children(recursive=True):
        try:
            rss += child.memory_info().rss
            ct = child.cpu_times()
            cpu += ct.user + ct.system
            count += 1
        except psutil.Error:  # it ended meanwhile
            continue
    return rss, cpu, count


def _histogram(
    family: HistogramMetricFamily,
    labels: list[str],
    bounds: Iterable[float],
    counts: list[int],
    total: float,
) -> None:
    """Add one histogram from per-bucket (not cumulative) counts; the last is +Inf's."""
    buckets: list[tuple[str, float]] = []
    running = 0
    for bound, n in zip(bounds, counts, strict=False):
        running += n
        buckets.append((_le(bound), running))
    buckets.append(("+Inf", sum(counts)))
    family.add_metric(labels, buckets, total)


def _le(bound: float) -> str:
    return repr(float(bound))


class PeerCollector:
    """A prometheus_client collector over one live :class:`~agiledart.peer.Peer`."""

    def __init__(self, peer: Peer) -> None:
        self.peer = peer
        self.process = psutil.Process(os.getpid())
        #: the process tree's (resident bytes, CPU seconds, processes), measured by the
        #: caller off the event loop before a collect; None: measured here
        self.usage: tuple[int, float, int] | None = None

    def collect(self) -> Iterator[Metric]:
        yield from self._peer()
        yield from self._overlay()
        yield from self._frames()
        yield from self._apps()
        yield from self._checkpoints()
        yield from self._process_tree()

    # -- the peer and its overlay -------------------------------------------------------

    def _peer(self) -> Iterator[Metric]:
        peer = self.peer
        info = GaugeMetricFamily(
            P + "peer_info", "This peer: its node id, zone and version", labels=_info_labels()
        )
        info.add_metric([peer.name, f"{peer.node_id:040x}", peer.config.zone, __version__], 1.0)
        yield info
        runtime = peer.runtime
        yield _gauge(
            "apps_hosted", "Apps with an instance on this peer", peer.name, len(runtime.instances)
        )
        yield _gauge(
            "records_store_entries",
            "Records held in this peer's share of the store",
            peer.name,
            len(runtime.records.local),
        )
        yield _gauge(
            "records_store_bytes",
            "Bytes of records held here",
            peer.name,
            runtime.records.local.bytes,
        )
        engine = runtime.engine.info()
        yield _gauge(
            "engine_workers",
            "Worker processes of the execution engine (configured)",
            peer.name,
            engine.get("workers", 0),
        )
        yield _counter(
            "engine_migrations",
            "Operator states moved between worker processes",
            peer.name,
            engine.get("migrations", 0),
        )
        dropped = CounterMetricFamily(
            P + "runtime_dropped",
            "Data or credit frames for an app or edge unknown here",
            labels=["peer", "reason"],
        )
        for reason, n in sorted(runtime.dropped.items()):
            dropped.add_metric([peer.name, reason], n)
        yield dropped

    def _overlay(self) -> Iterator[Metric]:
        node, name = self.peer.overlay, self.peer.name
        yield _gauge("ring_peers_known", "Peers this peer knows", name, len(node.known_peers()))
        yield _gauge(
            "leaf_set_size", "Members of this peer's leaf set", name, len(node.leaf_set.members())
        )
        events = CounterMetricFamily(
            P + "overlay_events",
            "Overlay events (routes forwarded, delivered...)",
            labels=["peer", "event"],
        )
        rejected = CounterMetricFamily(
            P + "messages_rejected",
            "Messages refused: failed authentication, replays, oversize, malformed",
            labels=["peer", "transport", "reason"],
        )
        for key, n in sorted(node.stats.items()):
            if key.startswith("rejected_"):
                rejected.add_metric([name, "udp", key.removeprefix("rejected_")], n)
            else:
                events.add_metric([name, key], n)
        for reason, n in sorted(self.peer.frames.statistics().rejected.items()):
            rejected.add_metric([name, "tcp", reason], n)
        yield events
        yield rejected
        hops = HistogramMetricFamily(
            P + "overlay_route_hops",
            "Forwarding steps of the routes this peer originated (JOINs, probes, lookups)",
            labels=["peer"],
        )
        counts = node.route_hops
        top = max([10, *counts])
        _histogram(
            hops,
            [name],
            range(top + 1),
            [counts.get(i, 0) for i in range(top + 1)] + [0],
            float(sum(h * n for h, n in counts.items())),
        )
        yield hops

    def _frames(self) -> Iterator[Metric]:
        stats, name = self.peer.frames.statistics(), self.peer.name
        frames = CounterMetricFamily(
            P + "frames", "TCP frames received and sent", labels=["peer", "direction"]
        )
        frames.add_metric([name, "in"], stats.frames_in)
        frames.add_metric([name, "out"], stats.frames_out)
        yield frames
        nbytes = CounterMetricFamily(
            P + "frame_bytes", "TCP bytes received and sent", labels=["peer", "direction"]
        )
        nbytes.add_metric([name, "in"], stats.bytes_in)
        nbytes.add_metric([name, "out"], stats.bytes_out)
        yield nbytes
        yield _gauge(
            "frame_connections", "Open incoming frame connections", name, stats.open_connections
        )
        events = CounterMetricFamily(
            P + "frame_events",
            "Other frame events (errors, unknown types...)",
            labels=["peer", "event"],
        )
        for event, n in sorted(stats.events.items()):
            events.add_metric([name, event], n)
        yield events

    # -- apps --------------------------------------------------------------------------

    def _apps(self) -> Iterator[Metric]:
        name = self.peer.name
        op_labels = ["peer", "app", "operator", "op"]
        fam: dict[str, Any] = {
            "in": CounterMetricFamily(
                P + "operator_tuples_in", "Tuples an operator instance took in", labels=op_labels
            ),
            "out": CounterMetricFamily(
                P + "operator_tuples_out", "Tuples an operator instance emitted", labels=op_labels
            ),
            "dropped": CounterMetricFamily(
                P + "operator_tuples_dropped",
                "Tuples an operator instance dropped: late (behind the watermark) or error",
                labels=[*op_labels, "reason"],
            ),
            "dead_letters": CounterMetricFamily(
                P + "operator_dead_letters",
                "Tuples an operator instance with on_error: dead_letter wrote to its "
                "dead-letter sink",
                labels=op_labels,
            ),
            "queue": GaugeMetricFamily(
                P + "operator_queue_tuples",
                "Tuples waiting in the instance's inbox",
                labels=op_labels,
            ),
            "batches": GaugeMetricFamily(
                P + "operator_queue_batches",
                "Batches and watermarks waiting in the inbox",
                labels=op_labels,
            ),
            "rate": GaugeMetricFamily(
                P + "operator_input_rate", "Tuples per second fed (last 10 s)", labels=op_labels
            ),
            "rho": GaugeMetricFamily(
                P + "operator_utilization",
                "Share of the last 10 s the inbox was not empty (EdgeWise's rho)",
                labels=op_labels,
            ),
            "busy": GaugeMetricFamily(
                P + "operator_busy_ratio",
                "Share of the last 10 s spent executing",
                labels=op_labels,
            ),
            "service": GaugeMetricFamily(
                P + "operator_service_seconds",
                "Execution time per tuple (last 10 s)",
                labels=op_labels,
            ),
            "instances": GaugeMetricFamily(
                P + "operator_instances",
                "Instances of the operator in its app",
                labels=["peer", "app", "operator"],
            ),
            "health": GaugeMetricFamily(
                P + "operator_health",
                "Health score f in (0, 1) of the operator here (elastic scaling, 1 best)",
                labels=["peer", "app", "operator"],
            ),
            "source": CounterMetricFamily(
                P + "source_tuples",
                "Tuples of a source: emitted, delayed (held back) or shed (dropped late)",
                labels=["peer", "app", "source", "outcome"],
            ),
            "sink": CounterMetricFamily(
                P + "sink_tuples", "Tuples a sink wrote", labels=["peer", "app", "sink"]
            ),
            "sink_dropped": CounterMetricFamily(
                P + "sink_dropped", "Tuples a sink could not write", labels=["peer", "app", "sink"]
            ),
            "edge": CounterMetricFamily(
                P + "edge_tuples",
                "Tuples sent to another peer, per edge",
                labels=["peer", "app", "edge"],
            ),
            "latency": HistogramMetricFamily(
                P + "app_latency_seconds",
                "End-to-end latency, source to sink, of the traced tuples of the app's sinks here",
                labels=["peer", "app"],
            ),
        }
        bounds = [b / 1000 for b in LatencyHistogram.BOUNDS_MS]
        for app_id, inst in sorted(self.peer.runtime.instances.items()):
            stats = inst.statistics()
            _operator_series(fam, name, app_id, stats.get("operators", {}), inst)
            for sid, s in sorted(stats.get("sources", {}).items()):
                for outcome in ("emitted", "delayed", "shed"):
                    fam["source"].add_metric([name, app_id, sid, outcome], s.get(outcome, 0))
            for kid, s in sorted(stats.get("sinks", {}).items()):
                fam["sink"].add_metric([name, app_id, kid], s.get("records", 0))
                fam["sink_dropped"].add_metric([name, app_id, kid], s.get("dropped", 0))
            for edge, s in sorted(stats.get("edges", {}).items()):
                fam["edge"].add_metric([name, app_id, edge], s.get("records", 0))
            if inst.sinks:
                merged = [0] * (len(bounds) + 1)
                total_ms = 0.0
                for state in inst.sinks.values():
                    merged = [a + b for a, b in zip(merged, state.histogram.counts, strict=True)]
                    total_ms += state.histogram.sum_ms
                _histogram(fam["latency"], [name, app_id], bounds, merged, total_ms / 1000)
        yield from fam.values()

    def _checkpoints(self) -> Iterator[Metric]:
        name = self.peer.name
        runtime = self.peer.runtime
        size = HistogramMetricFamily(
            P + "checkpoint_size_bytes",
            "Snapshot sizes of the checkpoints stored from this peer",
            labels=["peer"],
        )
        sizes = runtime.checkpoint_bytes
        _histogram(size, [name], sizes.bounds, list(sizes.counts), sizes.total)
        yield size
        duration = HistogramMetricFamily(
            P + "checkpoint_duration_seconds",
            "Time to encode and store a checkpoint's snapshot on its holders",
            labels=["peer"],
        )
        times = runtime.checkpoint_seconds
        _histogram(duration, [name], times.bounds, list(times.counts), times.total)
        yield duration
        yield _counter(
            "checkpoint_failures",
            "Snapshots of instances on this peer that could not be stored",
            name,
            runtime.checkpoint_failures,
        )
        yield _counter(
            "recoveries",
            "Apps restored on this peer from a committed checkpoint",
            name,
            runtime.restored,
        )

    def _process_tree(self) -> Iterator[Metric]:
        name = self.peer.name
        try:
            rss, cpu, count = self.usage or process_tree_usage(self.process)
        except psutil.Error:
            return
        yield _gauge(
            "process_tree_resident_bytes",
            "Resident memory of the peer process and its workers",
            name,
            rss,
        )
        yield _counter(
            "process_tree_cpu_seconds", "CPU time of the peer process and its workers", name, cpu
        )
        yield _gauge("process_tree_processes", "The peer process and its workers", name, count)


def _info_labels() -> list[str]:
    return ["peer", "node_id", "zone", "version"]


def _operator_series(
    fam: dict[str, Any], peer: str, app_id: str, ops: Mapping[str, Any], inst: Any
) -> None:
    hosts: Mapping[str, tuple[str, ...]] = inst.deployment.hosts
    for op_id, s in sorted(ops.items()):
        try:
            kind = inst.spec.operator(op_id).op
        except Exception:  # an operator name the spec does not know: still report it
            kind = ""
        labels = [peer, app_id, op_id, kind]
        fam["in"].add_metric(labels, s.get("records_in", 0))
        fam["out"].add_metric(labels, s.get("records_out", 0))
        fam["dropped"].add_metric([*labels, "late"], s.get("late", 0))
        fam["dropped"].add_metric([*labels, "error"], s.get("errors", 0))
        if "dead_letters" in s:
            fam["dead_letters"].add_metric(labels, s["dead_letters"])
        fam["queue"].add_metric(labels, s.get("queued", 0))
        fam["batches"].add_metric(labels, s.get("queued_batches", 0))
        fam["rate"].add_metric(labels, s.get("rate", 0.0))
        fam["rho"].add_metric(labels, s.get("utilization", 0.0))
        fam["busy"].add_metric(labels, s.get("busy", 0.0))
        service_us = s.get("service_us")
        fam["service"].add_metric(labels, 0.0 if service_us is None else service_us / 1e6)
        here = int(s.get("instances", 1))  # replicas on this peer, 1 on each other host
        others = max(1, len(hosts.get(op_id, ()))) - 1
        fam["instances"].add_metric([peer, app_id, op_id], here + others)
        if s.get("health") is not None:
            fam["health"].add_metric([peer, app_id, op_id], s["health"])


def _gauge(name: str, doc: str, peer: str, value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(P + name, doc, labels=["peer"])
    family.add_metric([peer], value)
    return family


def _counter(name: str, doc: str, peer: str, value: float) -> CounterMetricFamily:
    family = CounterMetricFamily(P + name, doc, labels=["peer"])
    family.add_metric([peer], value)
    return family


class _Collected:
    """Metric families already collected, as ``generate_latest`` takes a registry."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterable[Metric]:
        return self.families


class MetricsEndpoint:
    """The HTTP handler serving a peer's metrics at ``/metrics`` (and ``/``), behind
    ``token`` when one is given."""

    def __init__(
        self,
        peer: Peer,
        *,
        token: str | None = None,
        min_interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.collector = PeerCollector(peer)
        self.token = token
        self.min_interval_s = min_interval_s
        self.clock = clock
        self.renders = 0
        self._lock = asyncio.Lock()
        self._last: tuple[float, bytes, float] | None = None  #: (when, body, seconds)

    async def handle(self, request: Request) -> Response:
        if request.path not in ("/metrics", "/"):
            return Response.text(404, "not found: metrics are at /metrics\n")
        refused = self._refuse(request)
        if refused is not None:
            return refused
        body, elapsed = await self.render()
        return Response(
            200,
            body,
            content_type=CONTENT_TYPE_LATEST,
            headers=(("X-Scrape-Seconds", f"{elapsed:.4f}"),),
        )

    def _refuse(self, request: Request) -> Response | None:
        if self.token is None:
            return None
        auth = request.headers.get("authorization", "")
        if auth[:7].lower() != "bearer " or not auth[7:].strip():
            return Response.text(
                401,
                "the metrics endpoint needs its token: Authorization: Bearer TOKEN\n",
                headers=(("WWW-Authenticate", 'Bearer realm="agiledart-metrics"'),),
            )
        if not hmac.compare_digest(auth[7:].strip().encode(), self.token.encode()):
            return Response.text(403, "wrong metrics token\n")
        return None

    async def render(self) -> tuple[bytes, float]:
        """The exposition text (and the seconds it took), rendered at most once per
        ``min_interval_s`` however many scrape meanwhile."""
        async with self._lock:
            now = self.clock()
            if self._last is not None and now - self._last[0] < self.min_interval_s:
                return self._last[1], self._last[2]
            started = time.perf_counter()
            collector = self.collector
            try:
                collector.usage = await asyncio.to_thread(process_tree_usage, collector.process)
            except psutil.Error:
                collector.usage = None
            try:
                families = list(collector.collect())  # live state: read on the loop
            finally:
                collector.usage = None
            body = await asyncio.to_thread(generate_latest, _Collected(families))
            elapsed = time.perf_counter() - started
            self.renders += 1
            self._last = (self.clock(), body, elapsed)
            return body, elapsed


def metrics_handler(peer: Peer, *, token: str | None = None) -> Any:
    """The HTTP handler serving ``peer``'s metrics at ``/metrics`` (and ``/``)."""
    return MetricsEndpoint(peer, token=token).handle
