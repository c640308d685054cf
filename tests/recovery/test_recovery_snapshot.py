"""The Snapshottable protocol and the paper's adaptive recovery policy."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import agiledart.recovery as recovery
from agiledart import AgiledartError
from agiledart.recovery import (
    CheckpointPolicy,
    CodecConfigError,
    FragmentError,
    MixedFragmentsError,
    NotEnoughFragments,
    RecoveryError,
    RecoveryMode,
    Snapshottable,
    decode,
    default_policy,
    encode,
)
from agiledart.recovery.snapshot import MAX_INTERVAL_S, MIN_INTERVAL_S, SHORT_LIVED_S

KIB, MIB, HOUR = 1024, 1024 * 1024, 3600.0


class Counter:
    """A toy stateful operator: counts per key."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def snapshot(self) -> bytes:
        return json.dumps(self.counts, sort_keys=True).encode()

    def restore(self, state: bytes) -> None:
        self.counts = json.loads(state)


def test_an_operator_survives_through_fragments() -> None:
    before = Counter()
    before.counts = {"rome": 3, "oslo": 5}
    assert isinstance(before, Snapshottable)
    assert not isinstance(object(), Snapshottable)
    policy = default_policy(200 * KIB, math.inf, stateless=False)
    fragments = encode(
        before.snapshot(), m=policy.m, k=policy.k, app="a", instance="counter#0", epoch=1
    )
    after = Counter()
    after.restore(decode(fragments[policy.k :]))
    assert after.counts == before.counts


@pytest.mark.parametrize(
    ("state", "lifetime", "stateless", "holders"),
    [
        (10 * MIB, math.inf, True, 8),  # nothing to recover
        (10 * MIB, SHORT_LIVED_S - 1, False, 8),  # recovery costs more than it saves
        (0, math.inf, False, 8),  # stateful in name only
        (10 * MIB, math.inf, False, 0),  # nowhere to store fragments
    ],
)
def test_restart_only(state: int, lifetime: float, stateless: bool, holders: int) -> None:
    policy = default_policy(state, lifetime, stateless, holders=holders)
    assert policy == CheckpointPolicy.restart()
    assert (policy.mode, policy.n, policy.interval_s) == (RecoveryMode.RESTART, 0, math.inf)


@pytest.mark.parametrize(
    ("state", "holders", "mode", "m", "k"),
    [
        (1 * KIB, 8, RecoveryMode.REPLICATION, 1, 2),  # tiny: 3 copies, one round trip
        (100 * KIB, 8, RecoveryMode.REPLICATION, 1, 2),
        (200 * KIB, 8, RecoveryMode.ERASURE, 3, 2),
        (1 * MIB, 8, RecoveryMode.ERASURE, 6, 2),  # capped by the leaf set
        (1 * MIB, 16, RecoveryMode.ERASURE, 14, 2),
        (1 * MIB, 2, RecoveryMode.REPLICATION, 1, 1),  # a tiny leaf set
        (1 * MIB, 1, RecoveryMode.REPLICATION, 1, 0),
    ],
)
def test_long_lived_stateful(state: int, holders: int, mode: RecoveryMode, m: int, k: int) -> None:
    policy = default_policy(state, 24 * HOUR, stateless=False, holders=holders)
    assert (policy.mode, policy.m, policy.k) == (mode, m, k)


def test_interval_follows_the_upload() -> None:
    small = default_policy(10 * KIB, math.inf, stateless=False)
    large = default_policy(8 * MIB, math.inf, stateless=False)
    huge = default_policy(4096 * MIB, math.inf, stateless=False)
    assert small.interval_s == MIN_INTERVAL_S
    assert MIN_INTERVAL_S < large.interval_s < MAX_INTERVAL_S
    assert huge.interval_s == MAX_INTERVAL_S
    short = default_policy(4096 * MIB, 2 * SHORT_LIVED_S, stateless=False)
    assert short.interval_s == 2 * SHORT_LIVED_S / 10  # ten checkpoints in a lifetime


@given(
    st.integers(0, 2**40),
    st.floats(0, 1e9) | st.just(math.inf),
    st.booleans(),
    st.integers(0, 300),
)
def test_policy_invariants(state: int, lifetime: float, stateless: bool, holders: int) -> None:
    policy = default_policy(state, lifetime, stateless, holders=holders)
    assert policy.n <= holders
    if policy.mode is not RecoveryMode.RESTART:
        assert MIN_INTERVAL_S <= policy.interval_s <= MAX_INTERVAL_S
        bigger = default_policy(state * 2, lifetime, stateless, holders=holders)
        assert bigger.m >= policy.m


@pytest.mark.parametrize(
    "args", [(-1, 10.0, False), (1, -1.0, False), (1, math.nan, False), (1, 1.0, False, -1)]
)
def test_bad_policy_inputs(args: tuple[int, float, bool] | tuple[int, float, bool, int]) -> None:
    state, lifetime, stateless, *holders = args
    with pytest.raises(CodecConfigError):
        default_policy(state, lifetime, stateless, holders=holders[0] if holders else 8)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"mode": RecoveryMode.RESTART, "m": 2},
        {"mode": RecoveryMode.RESTART, "interval_s": 5.0},
        {"mode": RecoveryMode.ERASURE, "m": 1, "k": 2, "interval_s": 5.0},
        {"mode": RecoveryMode.ERASURE, "m": 4, "k": 2},  # no interval
        {"mode": RecoveryMode.ERASURE, "m": 200, "k": 57, "interval_s": 5.0},
        {"mode": RecoveryMode.REPLICATION, "m": 2, "k": 1, "interval_s": 5.0},
        {"mode": RecoveryMode.REPLICATION, "m": 1, "k": -1, "interval_s": 5.0},
    ],
)
def test_inconsistent_policies(kwargs: dict[str, object]) -> None:
    with pytest.raises(CodecConfigError):
        CheckpointPolicy(**kwargs)  # type: ignore[arg-type]


def test_public_api() -> None:
    assert sorted(recovery.__all__) == sorted(set(recovery.__all__))
    assert all(hasattr(recovery, name) for name in recovery.__all__)
    assert issubclass(RecoveryError, AgiledartError)
    assert issubclass(MixedFragmentsError, FragmentError)
    for error in (CodecConfigError, FragmentError, NotEnoughFragments):
        assert issubclass(error, RecoveryError)
    assert not issubclass(CodecConfigError, FragmentError)


def test_only_recovery_erasure_imports_zfec() -> None:
    root = Path(__file__).resolve().parents[2]
    importing = re.compile(r"^\s*(import|from)\s+zfec\b", re.MULTILINE)
    offenders = [
        str(path.relative_to(root))
        for folder in ("agiledart", "overlay", "bandit", "recovery", "scripts", "tests")
        for path in (root / folder).rglob("*.py")
        if importing.search(path.read_text(encoding="utf-8"))
    ]
    assert offenders == ["recovery/erasure.py"]
