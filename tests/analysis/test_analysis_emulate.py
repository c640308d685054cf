"""The report of a real ``agiledart emulate`` run: its latency table matches plain
Python over the same traces, and it opens in headless Chromium with every plot."""

from __future__ import annotations

import math
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from support.processes import free_port

from .browser import CHROMIUM, check_images, screenshot
from .traces import percentile_fits, read_csv, valid_records

pytestmark = [pytest.mark.processes, pytest.mark.slow, pytest.mark.timeout(400)]

AGILEDART = Path(sys.executable).with_name("agiledart")
NEEDS_CHROMIUM = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)"
)


@pytest.fixture(scope="module")
def emulated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("emulated")
    traces, out = root / "traces", root / "report"
    run = [str(AGILEDART), "emulate", "--peers", "4", "--duration", "8", "--trace-dir"]
    subprocess.run(
        [*run, str(traces), "--port", str(free_port()), "--json"],
        check=True,
        capture_output=True,
        timeout=100,
        cwd=root,
    )
    proc = subprocess.run(
        [str(AGILEDART), "analyze", str(traces), "--out", str(out)],
        check=True,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert "report: " in proc.stdout
    return {"traces": traces, "out": out}


def test_latency_table_matches_plain_python(emulated: dict[str, Path]) -> None:
    records = valid_records(emulated["traces"])
    tuples = [r for r in records if r["type"] == "tuple"]
    assert tuples, "emulate --trace-dir wrote no tuple records"
    t0 = min(r["ts"] for r in records)
    groups: dict[tuple[str, int], list[float]] = defaultdict(list)
    for r in tuples:
        groups[(r["app"], math.floor((r["ts"] - t0) / 1000.0))].append(r["latency_ms"])
    rows = read_csv(emulated["out"] / "tables" / "latency_windows.csv")
    assert rows
    assert {(r["app"], int(r["window"])) for r in rows} == set(groups)
    for row in rows:
        values = groups[(row["app"], int(row["window"]))]
        assert int(row["count"]) == len(values)
        for q in (50, 95, 99):
            assert percentile_fits(row[f"p{q}_ms"], values, q / 100)


@NEEDS_CHROMIUM
def test_report_opens_in_a_browser_with_every_plot(emulated: dict[str, Path]) -> None:
    report = emulated["out"] / "report.html"
    images, broken, ok = check_images(report)
    expected = len(list((emulated["out"] / "plots").glob("*.png")))
    assert expected >= 2  # latency and placement at least
    assert (images, broken, ok) == (expected, 0, "yes")
    shot = Path(tempfile.gettempdir()) / "agiledart-emulate-report.png"
    screenshot(report, shot)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@NEEDS_CHROMIUM
def test_a_missing_plot_is_noticed(spark: Any, tmp_path: Path) -> None:
    from agiledart.analysis import analyze
    from agiledart.analysis.simulated import main as simulate

    assert simulate(["--packets", "30", "--trace-dir", str(tmp_path / "t")]) == 0
    result = analyze(tmp_path / "t", tmp_path / "o", spark=spark)
    assert check_images(result.report) == (4, 0, "yes")
    (tmp_path / "o" / "plots" / "regret.png").unlink()
    assert check_images(result.report) == (4, 1, "no")
