"""``analyze`` over traces of the regret simulator: the regret curve, path shares, delay
CDF and hop outcomes match the simulator's own figures and plain Python on the files."""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agiledart.analysis import Analysis, analyze
from agiledart.analysis.simulated import main as simulated_main
from agiledart.analysis.simulated import make_policy, trace_simulation
from agiledart.bandit import SimResult, paper_network
from agiledart.traces import TraceWriter

from .traces import close, percentile_fits, read_csv, valid_records

PACKETS = 120
POLICIES = ("agiledart", "next-hop")


@pytest.fixture(scope="module")
def simulated(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("simulated")
    graph = paper_network(25, rng=np.random.default_rng(3))
    results: dict[str, SimResult] = {}
    for name in POLICIES:
        with TraceWriter(root / "traces", f"sim-{name}", compress=name == "next-hop") as w:
            policy = make_policy(name, graph)
            results[name] = trace_simulation(graph, policy, w, packets=PACKETS, seed=5)
    analysis = analyze(root / "traces", root / "out", spark=spark)
    return {"root": root, "graph": graph, "results": results, "analysis": analysis}


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


def test_regret_curve_matches_plain_python(simulated: dict[str, Any]) -> None:
    deliveries = [r for r in valid_records(simulated["root"] / "traces") if r["type"] == "delivery"]
    series: dict[tuple[str, ...], list[dict[str, Any]]] = defaultdict(list)
    for d in deliveries:
        series[(d["policy"], d["graph"], d["origin"], d["dest"])].append(d)
    expected = {}
    for key, items in series.items():
        total = 0.0
        for d in sorted(items, key=lambda d: d["k"]):
            total += d["delay_ms"] - d["optimal_ms"]
            expected[(*key, d["k"])] = total
    rows = _table(simulated, "regret")
    assert len(rows) == len(expected)
    for r in rows:
        key = (r["policy"], r["graph"], r["origin"], r["dest"], int(r["k"]))
        assert close(float(r["regret_ms"]), expected[key])
    summary = {r["policy"]: r for r in _table(simulated, "regret_summary")}
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
    assert analysis.records["delivery"] == PACKETS * len(POLICIES)


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
