"""A scheduler's checkpoint budget (:class:`~agiledart.runtime.epochs.Pacer`): epochs
start at most ``rate`` a second over all its apps, first come, first served, so with
many checkpointed apps each app's interval stretches instead of the peers drowning.

The schedule is simulated on a virtual clock exactly as the scheduler's checkpoint loop
uses the pacer: an app asks for a slot when its interval has run out, waits for it,
cuts, and sleeps its interval again."""

from __future__ import annotations

import heapq
import itertools
import math
from collections import defaultdict

import pytest
from support.apps import running_record

from agiledart.cli.entry import build_parser
from agiledart.runtime.appstatus import status_view
from agiledart.runtime.epochs import CHECKPOINT_RATE, Pacer


def simulate(apps: int, interval: float, rate: float, until: float) -> dict[int, list[float]]:
    """When each app cut its epochs, ``apps`` apps with one ``interval`` on one pacer."""
    pacer = Pacer(rate)
    cuts: dict[int, list[float]] = defaultdict(list)
    due = [(interval + i * 1e-3, i) for i in range(apps)]  # submitted one after another
    heapq.heapify(due)
    while due:
        now, app = heapq.heappop(due)
        if now > until:
            break
        cut = now + pacer.reserve(now)
        cuts[app].append(cut)
        heapq.heappush(due, (cut + interval, app))
    return cuts


def test_below_the_budget_nobody_waits() -> None:
    pacer = Pacer(4.0)
    assert [pacer.reserve(t) for t in (0.0, 10.0, 10.25, 30.0)] == [0.0, 0.0, 0.0, 0.0]
    cuts = simulate(apps=20, interval=10.0, rate=4.0, until=200.0)  # 2 a second: room
    for times in cuts.values():
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert gaps
        assert all(math.isclose(g, 10.0) for g in gaps)


def test_apps_due_together_start_a_gap_apart_in_the_order_they_asked() -> None:
    pacer = Pacer(4.0)
    assert [pacer.reserve(100.0) for _ in range(5)] == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert pacer.reserve(100.6) == pytest.approx(0.65)  # behind the queue
    assert pacer.reserve(200.0) == 0.0  # the queue has drained


def test_past_the_budget_intervals_stretch_to_apps_over_rate_and_the_rate_holds() -> None:
    apps, rate = 1_000, 4.0
    cuts = simulate(apps=apps, interval=10.0, rate=rate, until=2_000.0)
    every = sorted(t for times in cuts.values() for t in times)
    # never more than `rate` epochs started in any second
    assert all(b - a >= 1.0 / rate - 1e-9 for a, b in itertools.pairwise(every))
    # every app keeps checkpointing (nobody starves), each about every apps / rate s
    assert len(cuts) == apps
    later = [b - a for times in cuts.values() for a, b in itertools.pairwise(times)]
    assert later
    assert all(g == pytest.approx(apps / rate, rel=0.01) for g in later)


@pytest.mark.parametrize("rate", [0.0, -1.0, math.nan, math.inf])
def test_a_rate_that_is_not_a_positive_number_is_refused(rate: float) -> None:
    with pytest.raises(ValueError, match="checkpoint rate"):
        Pacer(rate)


def test_the_peer_option_sets_the_rate_and_refuses_nonsense(
    capsys: pytest.CaptureFixture[str],
) -> None:
    parser = build_parser()
    base = ["peer", "--listen", "127.0.0.1:0"]
    assert parser.parse_args(base).checkpoint_rate == CHECKPOINT_RATE
    assert parser.parse_args([*base, "--checkpoint-rate", "0.5"]).checkpoint_rate == 0.5
    for bad in ("0", "-2", "nan", "inf", "often"):
        with pytest.raises(SystemExit):
            build_parser().parse_args([*base, "--checkpoint-rate", bad])
        assert "--checkpoint-rate" in capsys.readouterr().err


def test_status_shows_how_long_the_last_epoch_waited_for_its_slot() -> None:
    rec = running_record("q-1")
    committed = {"epoch": 3, "bytes": 10, "store_s": 0.01, "cut_s": 0.05, "at": 1.0}
    rec.checkpoint = {**committed, "waited_s": 1.5}
    assert status_view(rec, {})["checkpoint"]["waited_s"] == 1.5
    rec.checkpoint = dict(committed)  # a record written before the budget existed
    assert status_view(rec, {})["checkpoint"] == {**committed, "waited_s": 0.0}
