"""``analyze`` over traces of the regret simulator: the regret curve, path shares, delay
CDF and hop outcomes match the simulator's own figures and plain Python on the files."""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agiledart.analysis import Analysis, analyze
from agiledart.analysis.partials import CURVE_POINTS
from agiledart.analysis.simulated import main as simulated_main
from agiledart.analysis.simulated import make_policy, trace_simulation
from agiledart.bandit import SimResult, paper_network
from agiledart.traces import TraceWriter

from .traces import close, percentile_fits, read_csv, valid_records

PACKETS = 120
POLICIES = ("agiledart", "next-hop")
#: packets of a series written apart: more than the regret curve has points
BULK = 2500


def _bulk(root: Path) -> int:
    """A series of :data:`BULK` deliveries (policy ``bulk``) over two peers' files, which
    see different ranges of ``k`` (so their buckets have different widths), one ``k``
    delivered twice and every fifth without ``optimal_ms``; returns the deliveries."""
    t0 = time.time() * 1000.0
    written = 0
    with TraceWriter(root, "bulk-1") as one, TraceWriter(root, "bulk-2") as two:
        for k in [*range(1, BULK + 1), 1501]:
            writer = one if k <= 900 or k % 10 == 0 else two
            writer.emit(
                "delivery",
                ts=t0 + k,
                app="bulk",
                packet=str(written),
                origin="a",
                dest="b",
                k=k,
                path=["a", "b"],
                attempts=1,
                delay_ms=float(10 + k % 7),
                optimal_ms=None if k % 5 == 0 else 9.0 + k % 3,
                policy="bulk",
                graph=None,
            )
            written += 1
    return written


@pytest.fixture(scope="module")
def simulated(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("simulated")
    graph = paper_network(25, rng=np.random.default_rng(3))
    results: dict[str, SimResult] = {}
    for name in POLICIES:
        with TraceWriter(root / "traces", f"sim-{name}", compress=name == "next-hop") as w:
            policy = make_policy(name, graph)
            results[name] = trace_simulation(graph, policy, w, packets=PACKETS, seed=5)
    bulk = _bulk(root / "traces")
    analysis = analyze(root / "traces", root / "out", spark=spark)
    return {"root": root, "graph": graph, "results": results, "analysis": analysis, "bulk": bulk}


def _table(simulated: dict[str, Any], name: str) -> list[dict[str, str]]:
    analysis: Analysis = simulated["analysis"]
    return read_csv(analysis.out / "tables" / f"{name}.csv")


def test_regret_curve_is_the_simulators(simulated: dict[str, Any]) -> None:
    rows = _table(simulated, "regret")
    for name, result in simulated["results"].items():
        mine = [r for r in rows if r["policy"] == name]
        assert [int(r["k"]) for r in mine] == list(range(1, PACKETS + 1))  # few packets: all
        expected = result.regret()
        for r in mine:
            assert close(float(r["regret_ms"]), float(expected[int(r["k"]) - 1]))
            assert r["graph"] == simulated["graph"].name


def _curve(deliveries: list[dict[str, Any]]) -> dict[tuple[Any, ...], tuple[int, float, float]]:
    """The regret curve as docs/traces.md defines it, in plain Python: per series (the
    deliveries with ``optimal_ms``), buckets of ``W`` consecutive ``k`` (``W`` the
    smallest power of two making at most CURVE_POINTS of them), a point after each
    bucket: (series..., its largest k) -> (packets so far, R so far, the bucket's mean
    delay)."""
    series: dict[tuple[str, ...], list[dict[str, Any]]] = defaultdict(list)
    for d in deliveries:
        if d["optimal_ms"] is not None:
            series[(d["policy"], d["graph"] or "", d["origin"], d["dest"])].append(d)
    expected = {}
    for key, items in series.items():
        width, last = 1, max(1, *(d["k"] for d in items))
        while -(-last // width) > CURVE_POINTS:
            width *= 2
        buckets: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for d in items:
            buckets[-(-d["k"] // width)].append(d)
        packets, total = 0, 0.0
        for bucket in sorted(buckets):
            inside = buckets[bucket]
            packets += len(inside)
            total += sum(d["delay_ms"] - d["optimal_ms"] for d in inside)
            delay = sum(d["delay_ms"] for d in inside) / len(inside)
            expected[(*key, max(d["k"] for d in inside))] = (packets, total, delay)
    return expected


def test_regret_curve_matches_plain_python(simulated: dict[str, Any]) -> None:
    deliveries = [r for r in valid_records(simulated["root"] / "traces") if r["type"] == "delivery"]
    expected = _curve(deliveries)
    rows = _table(simulated, "regret")
    assert len(rows) == len(expected)
    for r in rows:
        key = (r["policy"], r["graph"], r["origin"], r["dest"], int(r["k"]))
        packets, regret, delay = expected[key]
        assert int(r["packets"]) == packets
        assert close(float(r["regret_ms"]), regret)
        assert close(float(r["delay_ms"]), delay)
    bulk = [r for r in rows if r["policy"] == "bulk"]
    assert len(bulk) == -(-BULK // 4)  # buckets of 4 packets: at most CURVE_POINTS
    summary = {r["policy"]: r for r in _table(simulated, "regret_summary")}
    assert close(float(summary["bulk"]["regret_ms"]), float(bulk[-1]["regret_ms"]))
    assert int(summary["bulk"]["without_optimal"]) == BULK // 5
    for name, result in simulated["results"].items():
        assert int(summary[name]["packets"]) == PACKETS
        assert close(float(summary[name]["regret_ms"]), float(result.regret()[-1]))


def test_path_shares_and_delay_cdf(simulated: dict[str, Any]) -> None:
    graph = simulated["graph"]
    ids = [str(n) for n in graph.node_ids]
    paths = _table(simulated, "paths")
    cdf = _table(simulated, "delay_cdf")
    for name, result in simulated["results"].items():
        taken = Counter(
            " > ".join([ids[graph.source], *(ids[int(graph.head[link])] for link in p)])
            for p in result.paths
        )
        mine = [r for r in paths if r["policy"] == name]
        assert [int(r["rank"]) for r in mine] == list(range(1, len(mine) + 1))
        for r in mine:
            assert int(r["packets"]) == taken[r["path"]]
            assert close(float(r["share"]), taken[r["path"]] / PACKETS)
        assert int(mine[0]["packets"]) == max(taken.values())
        levels = {round(float(r["fraction"]), 2): r["delay_ms"] for r in cdf if r["policy"] == name}
        assert len(levels) == 101
        for q in (0.0, 0.25, 0.5, 0.9, 1.0):
            assert percentile_fits(levels[q], list(result.delay_ms), q)


def test_hop_attempts(simulated: dict[str, Any]) -> None:
    graph = simulated["graph"]
    outcomes = _table(simulated, "shuffle_outcomes")
    hops = _table(simulated, "shuffle_hops")
    for name, result in simulated["results"].items():
        attempts = round(result.delay_ms.sum() / graph.slot_ms)
        hop_count = sum(len(p) for p in result.paths)
        got = {r["outcome"]: int(r["attempts"]) for r in outcomes if r["policy"] == name}
        assert got == {"ok": hop_count, "lost": attempts - hop_count}
        first = next(r for r in hops if r["policy"] == name and r["hop"] == "0")
        assert int(first["ok"]) == PACKETS
        assert close(float(first["success_rate"]), PACKETS / int(first["attempts"]))


def test_report_has_routing_and_says_what_is_missing(simulated: dict[str, Any]) -> None:
    analysis: Analysis = simulated["analysis"]
    page = analysis.report.read_text()
    for plot in ("regret", "paths", "delay_cdf", "shuffle_outcomes"):
        assert f'src="plots/{plot}.png"' in page
        assert (analysis.out / "plots" / f"{plot}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert page.count("no records of this type") == 8  # no tuple, opstats, placement...
    assert analysis.malformed_total == 0
    assert analysis.records["delivery"] == PACKETS * len(POLICIES) + simulated["bulk"]


def test_the_converter_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = simulated_main(
        [
            "--paper-size",
            "25",
            "--policy",
            "optimal",
            "--packets",
            "20",
            "--trace-dir",
            str(tmp_path),
        ]
    )
    assert code == 0
    assert "optimal: 20 packets on road-25" in capsys.readouterr().out
    records = valid_records(tmp_path)
    assert sum(r["type"] == "delivery" for r in records) == 20
    assert {r["peer"] for r in records} == {"sim-optimal"}
    assert (
        simulated_main(["--graph", str(tmp_path / "none.json"), "--trace-dir", str(tmp_path)]) == 1
    )


def test_deliveries_without_optimal_delay_have_no_regret_curve(spark: Any, tmp_path: Path) -> None:
    """A trace whose deliveries never carry ``optimal_ms`` (no optimum known): an empty
    regret curve and no regret plot, the other routing tables and plots all there."""
    t0 = time.time() * 1000.0
    with TraceWriter(tmp_path / "traces", "peer-1") as writer:
        for k in range(1, 41):
            writer.emit(
                "delivery",
                ts=t0 + k,
                app="a",
                packet=str(k),
                origin="a",
                dest="c",
                k=k,
                path=["a", "b", "c"] if k % 4 else ["a", "c"],
                attempts=1,
                delay_ms=float(5 + k % 3),
                optimal_ms=None,
                policy="kl-ucb",
                graph="g",
            )
    analysis = analyze(tmp_path / "traces", tmp_path / "out", spark=spark)
    tables = analysis.out / "tables"
    assert read_csv(tables / "regret.csv") == []
    assert (tables / "regret.csv").read_text().startswith("policy,")  # the header only
    paths = read_csv(tables / "paths.csv")
    assert {r["path"]: int(r["packets"]) for r in paths} == {"a > b > c": 30, "a > c": 10}
    assert sum(int(r["packets"]) for r in read_csv(tables / "delay_cdf.csv")[:1]) == 40
    page = analysis.report.read_text()
    assert 'src="plots/regret.png"' not in page
    assert not (analysis.out / "plots" / "regret.png").exists()
    for plot in ("paths", "delay_cdf"):
        assert (analysis.out / "plots" / f"{plot}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
