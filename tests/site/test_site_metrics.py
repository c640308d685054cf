"""The Prometheus endpoint of real peers with apps running: it parses, and it carries
the series operators need (per operator instance, per app, per peer)."""

from __future__ import annotations

import socket
import urllib.request
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.processes import poll
from support.site import Site

pytestmark = [pytest.mark.processes, pytest.mark.slow]

Samples = dict[str, list[tuple[dict[str, str], float]]]

FAMILIES = {
    # name as the parser reports it (counters without _total) -> type
    "agiledart_peer_info": "gauge",
    "agiledart_operator_tuples_in": "counter",
    "agiledart_operator_tuples_out": "counter",
    "agiledart_operator_tuples_dropped": "counter",
    "agiledart_operator_queue_tuples": "gauge",
    "agiledart_operator_queue_batches": "gauge",
    "agiledart_operator_input_rate": "gauge",
    "agiledart_operator_utilization": "gauge",
    "agiledart_operator_busy_ratio": "gauge",
    "agiledart_operator_service_seconds": "gauge",
    "agiledart_operator_instances": "gauge",
    "agiledart_source_tuples": "counter",
    "agiledart_sink_tuples": "counter",
    "agiledart_app_latency_seconds": "histogram",
    "agiledart_checkpoint_size_bytes": "histogram",
    "agiledart_checkpoint_duration_seconds": "histogram",
    "agiledart_recoveries": "counter",
    "agiledart_overlay_route_hops": "histogram",
    "agiledart_leaf_set_size": "gauge",
    "agiledart_ring_peers_known": "gauge",
    "agiledart_messages_rejected": "counter",
    "agiledart_frames": "counter",
    "agiledart_process_tree_resident_bytes": "gauge",
    "agiledart_process_tree_cpu_seconds": "counter",
    "agiledart_process_tree_processes": "gauge",
}


def scrape(site: Site, i: int) -> Samples:
    with urllib.request.urlopen(site.metrics_url(i), timeout=10) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = resp.read().decode()
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        assert family.name not in out, family.name
        if family.name in FAMILIES:
            assert family.type == FAMILIES[family.name], family.name
        out[family.name] = [(s.labels, s.value) for s in family.samples]
        out.update({s.name: [] for s in family.samples if s.name not in out})
        for s in family.samples:
            if s.name != family.name:
                out[s.name].append((s.labels, s.value))
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    found = [v for ls, v in samples.get(name, []) if all(ls.get(k) == x for k, x in labels.items())]
    assert len(found) == 1, (name, labels, samples.get(name))
    return found[0]


def test_metrics_parse_and_carry_every_series(site: Site) -> None:
    app_id = site.apps["urban-sensing"]
    status = site.status(app_id)
    host = site.index(status["placement"]["averages"][0])
    sink = site.index(status["sinks"]["averages-out"])

    def hosted() -> Samples | None:
        s = scrape(site, host)
        fed = value(s, "agiledart_operator_tuples_in_total", app=app_id, operator="averages")
        return s if fed > 0 else None

    samples = poll(hosted, what="the averages operator counts its input", timeout=60)
    missing = sorted(set(FAMILIES) - set(samples))
    assert not missing
    name = site.cluster.name(host)
    labels = {"peer": name, "app": app_id, "operator": "averages", "op": "window"}
    for series in (
        "agiledart_operator_queue_tuples",
        "agiledart_operator_input_rate",
        "agiledart_operator_utilization",
        "agiledart_operator_tuples_out_total",
    ):
        assert value(samples, series, **labels) >= 0
    assert value(samples, "agiledart_operator_tuples_dropped_total", **labels, reason="late") >= 0
    instances = value(samples, "agiledart_operator_instances", app=app_id, operator="averages")
    assert instances == len(status["placement"]["averages"])
    assert value(samples, "agiledart_leaf_set_size", peer=name) >= 1
    assert value(samples, "agiledart_ring_peers_known", peer=name) == site.cluster.peers - 1
    # the whole process tree: the peer and its worker
    assert value(samples, "agiledart_process_tree_processes", peer=name) >= 2
    assert value(samples, "agiledart_process_tree_resident_bytes", peer=name) > 20e6
    assert value(samples, "agiledart_process_tree_cpu_seconds_total", peer=name) > 0
    # no checkpoints yet: the families exist, at zero
    assert value(samples, "agiledart_recoveries_total", peer=name) == 0
    assert value(samples, "agiledart_checkpoint_size_bytes_count", peer=name) == 0

    def latency() -> Samples | None:
        s = scrape(site, sink)
        count = value(s, "agiledart_app_latency_seconds_count", app=app_id)
        return s if count > 0 else None

    at_sink = poll(latency, what="end-to-end latency samples at the sink", timeout=60)
    inf = value(at_sink, "agiledart_app_latency_seconds_bucket", app=app_id, le="+Inf")
    assert inf == value(at_sink, "agiledart_app_latency_seconds_count", app=app_id)
    assert value(at_sink, "agiledart_sink_tuples_total", app=app_id, sink="averages-out") > 0

    source = site.index(status["sources"]["readings-a"])
    at_source = scrape(site, source)
    emitted = value(
        at_source,
        "agiledart_source_tuples_total",
        app=app_id,
        source="readings-a",
        outcome="emitted",
    )
    assert emitted > 0
    # the source peer routed JOINs toward the sink: its route-hop histogram counts them
    assert value(at_source, "agiledart_overlay_route_hops_count") >= 1


def test_rejected_frames_are_counted(site: Site) -> None:
    i = 1
    before = _rejected(scrape(site, i), "tcp")
    host, port = site.cluster.address(i)
    with socket.create_connection((host, port), timeout=5) as s:
        s.sendall(b"\xff" * 64 + b"not a frame handshake" * 10)
        s.settimeout(5)
        try:
            while s.recv(4096):
                pass
        except OSError:
            pass
    poll(lambda: _rejected(scrape(site, i), "tcp") > before, what="the rejection counted")


def _rejected(samples: Samples, transport: str) -> float:
    rows: list[tuple[dict[str, Any], float]] = samples.get("agiledart_messages_rejected_total", [])
    return sum(v for ls, v in rows if ls["transport"] == transport)


def test_metrics_endpoint_answers_only_metrics(site: Site) -> None:
    url = site.metrics_url(0).replace("/metrics", "/nope")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(url, timeout=10).close()
    with err.value:
        assert err.value.code == 404
