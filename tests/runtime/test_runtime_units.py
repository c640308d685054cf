"""The runtime's pure parts, in process: the records store's local share, registered
code, segments and partitioning of an instance, and the wire forms of deployments and
app records."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import msgpack
import pytest

from agiledart.app import AppSpec, parse_spec
from agiledart.app.errors import ExecutionError, SpecError
from agiledart.runtime.appstate import AppRecord
from agiledart.runtime.appstatus import merged_operator, status_view
from agiledart.runtime.checkpointing import told_of_commits
from agiledart.runtime.code import Bundle, CodeStore, code_id_of, code_ids_in
from agiledart.runtime.deployment import Deployment
from agiledart.runtime.errors import CodeError, StoreError, UnknownApp
from agiledart.runtime.records import LocalRecords, record_key
from agiledart.runtime.segments import Item as _Item
from agiledart.runtime.segments import Segment
from agiledart.runtime.segments import append as _append
from agiledart.runtime.segments import mergeable as _mergeable
from agiledart.runtime.topology import partition_key as _partition_key
from agiledart.runtime.topology import segments as _segments

# -- records ------------------------------------------------------------------------------


def packed(value: Any) -> int:
    return len(msgpack.packb(value, use_bin_type=True))


def test_a_newer_version_replaces_and_an_older_one_is_ignored() -> None:
    store = LocalRecords()
    assert store.put(1, 10, "first")
    assert store.put(1, 20, "second")
    assert not store.put(1, 15, "stale")
    assert not store.put(1, 20, "same version")
    assert store.get(1) == (20, "second")
    assert store.get(2) is None
    assert len(store) == 1


def test_add_merges_members_into_a_set() -> None:
    store = LocalRecords()
    store.add(7, 1, ["a", "b"])
    store.add(7, 1, ["b", "c"])  # same writer clock: still merged, version moves on
    store.add(7, 0, ["a"])
    found = store.get(7)
    assert found is not None
    assert found[1] == ["a", "b", "c"]
    assert found[0] > 1


def test_add_over_a_value_that_is_not_a_set_starts_a_new_one() -> None:
    store = LocalRecords()
    store.put(7, 1, {"not": "a list"})
    store.add(7, 1, ["x"])
    assert store.get(7) == (2, ["x"])


def test_a_value_over_the_limit_is_refused_and_the_old_one_kept() -> None:
    store = LocalRecords(max_value=100)
    store.put(1, 1, "small")
    with pytest.raises(StoreError, match="exceeds the limit of 100"):
        store.put(1, 2, b"x" * 200)
    assert store.get(1) == (1, "small")


def test_the_byte_bound_evicts_the_oldest_written_records() -> None:
    value = b"x" * 90
    store = LocalRecords(max_value=100, max_bytes=3 * packed(value) - 1)
    store.put(1, 1, value)
    store.put(2, 1, value)
    store.put(3, 1, value)  # one over the bound: key 1 goes
    assert store.get(1) is None
    assert [store.get(k) is not None for k in (2, 3)] == [True, True]
    store.put(2, 2, value)  # rewriting 2 makes 3 the oldest
    store.put(4, 1, value)
    assert store.get(3) is None
    assert store.get(2) == (2, value)
    assert store.get(4) == (1, value)
    assert len(store) == 2


def test_record_keys_are_namespaced() -> None:
    assert record_key("app", "x") == record_key("app", "x")
    assert record_key("app", "x") != record_key("code", "x")
    assert record_key("app", "x") != record_key("app", "y")
    assert 0 <= record_key("peer", "sensor-1") < 2**160


# -- registered code ----------------------------------------------------------------------

BUNDLE = b"def double(r):\n    return {**r, 'v': 2 * r['v']}\n\n\ndef _hidden(r):\n    return r\n"


async def test_register_returns_the_sha256_of_the_source(tmp_path: Path) -> None:
    import hashlib

    store = CodeStore(None, tmp_path / "code")
    code_id = await store.register(BUNDLE, "double.py")
    assert code_id == hashlib.sha256(BUNDLE).hexdigest() == code_id_of(BUNDLE)
    cached = msgpack.unpackb((tmp_path / "code" / f"{code_id}.bundle").read_bytes())
    assert cached == ["module", "double", BUNDLE]
    assert store.compile(BUNDLE) == code_id


def test_a_syntax_error_names_the_file(tmp_path: Path) -> None:
    store = CodeStore(None, tmp_path)
    with pytest.raises(CodeError, match=r"broken\.py does not load: SyntaxError"):
        store.compile(b"def f(:\n", "broken.py")


def test_a_module_that_raises_at_import_is_refused(tmp_path: Path) -> None:
    store = CodeStore(None, tmp_path)
    with pytest.raises(CodeError, match=r"boom\.py does not load: ZeroDivisionError"):
        store.compile(b"x = 1 / 0\n", "boom.py")


async def test_fetching_an_unknown_id_is_not_registered(tmp_path: Path) -> None:
    store = CodeStore(None, tmp_path)
    with pytest.raises(CodeError, match="not registered"):
        await store.fetch(["ab" * 32])
    with pytest.raises(CodeError, match="is not a code id"):
        await store.fetch(["not-hex"])


async def test_a_cached_file_with_the_wrong_digest_is_refused(tmp_path: Path) -> None:
    code_id = code_id_of(BUNDLE)
    tampered = msgpack.packb(["module", "double", BUNDLE + b"import os\n"])
    (tmp_path / f"{code_id}.bundle").write_bytes(tampered)
    store = CodeStore(None, tmp_path)
    with pytest.raises(CodeError, match=r"cached copy .* is corrupt"):
        await store.fetch([code_id])


async def test_a_cached_file_is_loaded_by_a_fresh_store(tmp_path: Path) -> None:
    code_id = await CodeStore(None, tmp_path).register(BUNDLE)
    fresh = CodeStore(None, tmp_path)
    await fresh.fetch([code_id])
    assert fresh.resolver()(f"{code_id}:double")({"v": 3}) == {"v": 6}


async def test_the_resolver_resolves_registered_code_and_builtins(tmp_path: Path) -> None:
    store = CodeStore(None, tmp_path)
    code_id = await store.register(BUNDLE)
    resolve = store.resolver()
    assert resolve(f"{code_id}:double")({"v": 21}) == {"v": 42}
    assert callable(resolve("builtin:identity"))
    with pytest.raises(CodeError, match="not loaded here"):
        resolve("cd" * 32 + ":double")


async def test_a_missing_function_lists_what_the_module_defines(tmp_path: Path) -> None:
    store = CodeStore(None, tmp_path)
    code_id = await store.register(BUNDLE)
    with pytest.raises(CodeError, match=r"has no function 'triple'; it defines: double$"):
        store.resolver()(f"{code_id}:triple")


async def test_what_a_bundle_imports_is_not_listed_as_its_functions(tmp_path: Path) -> None:
    store = CodeStore(None, tmp_path)
    source = (
        "from agiledart.app import factory\n"
        "from math import log\n\n\n"
        "@factory\n"
        "def scaled(*, k=1):\n"
        "    return lambda r: {**r, 'v': r['v'] * k}\n"
    )
    code_id = await store.register(source.encode())
    with pytest.raises(CodeError, match=r"it defines: scaled$"):
        store.resolver()(f"{code_id}:triple")


def test_code_ids_in_skips_builtins_and_empty_references() -> None:
    refs = [None, "builtin:identity", "a" * 64 + ":f", "a" * 64 + ":g", "b" * 64 + ":h", ""]
    assert code_ids_in(refs) == {"a" * 64, "b" * 64}


# -- segments and partitioning -------------------------------------------------------------


def spec_of(operators: list[dict[str, Any]], sink_inputs: list[str]) -> AppSpec:
    return parse_spec(
        {
            "name": "t",
            "sources": [
                {
                    "id": "src",
                    "peer": "p",
                    "connector": "generator",
                    "params": {"dataset": "urban", "rate": 10, "count": 10},
                }
            ],
            "operators": operators,
            "sinks": [{"id": "out", "peer": "p", "connector": "stdout", "inputs": sink_inputs}],
        }
    )


def mapping(op_id: str, *inputs: str) -> dict[str, Any]:
    return {"id": op_id, "op": "map", "fn": "builtin:identity", "inputs": list(inputs)}


CHAIN = spec_of(
    [mapping("a", "src"), mapping("b", "a"), mapping("c", "b"), mapping("d", "c")], ["d"]
)

#: a -> b -> c and a -> c: with b elsewhere, the path a -> b -> c re-enters {a, c}
DIAMOND = spec_of(
    [mapping("a", "src"), mapping("b", "a"), {"id": "c", "op": "union", "inputs": ["a", "b"]}],
    ["c"],
)


def as_sets(groups: list[list[str]]) -> set[frozenset[str]]:
    return {frozenset(g) for g in groups}


def test_local_operators_joined_by_local_edges_form_one_segment() -> None:
    assert _segments(CHAIN, {"a", "b", "c", "d"}, alone=set()) == [["a", "b", "c", "d"]]
    groups = _segments(CHAIN, {"a", "b", "d"}, alone=set())
    assert as_sets(groups) == {frozenset({"a", "b"}), frozenset({"d"})}


def test_a_segment_that_a_path_leaves_and_reenters_is_split() -> None:
    assert _segments(DIAMOND, {"a", "b", "c"}, alone=set()) == [["a", "b", "c"]]
    assert as_sets(_segments(DIAMOND, {"a", "c"}, alone=set())) == {
        frozenset({"a"}),
        frozenset({"c"}),
    }


def test_operators_with_several_instances_are_segments_of_their_own() -> None:
    groups = _segments(CHAIN, {"a", "b", "c", "d"}, alone={"c"})
    assert as_sets(groups) == {frozenset({"a", "b"}), frozenset({"c"}), frozenset({"d"})}


KEYED = spec_of(
    [
        mapping("m", "src"),
        {"id": "kb", "op": "key_by", "params": {"key": "city"}, "inputs": ["m"]},
        {
            "id": "w",
            "op": "window",
            "params": {"size_ms": 1000, "key": "city", "aggregate": "count"},
            "inputs": ["kb"],
        },
        {
            "id": "g",
            "op": "aggregate",
            "params": {"key": "sensor", "aggregate": "count"},
            "inputs": ["kb"],
        },
        {"id": "dd", "op": "dedupe", "params": {"key": "id", "ttl_ms": 100}, "inputs": ["m"]},
        {
            "id": "j",
            "op": "join",
            "params": {"key": "city", "window_ms": 100},
            "inputs": ["m", "kb"],
        },
        {
            "id": "top",
            "op": "top_k",
            "params": {"k": 3, "by": "value", "window_ms": 1000},
            "inputs": ["w"],
        },
        {
            "id": "all",
            "op": "window",
            "params": {"size_ms": 1000, "aggregate": "count"},
            "inputs": ["m"],
        },
    ],
    ["w", "g", "dd", "j", "top", "all"],
)


def test_stateless_operators_take_records_in_turn() -> None:
    assert _partition_key(KEYED, "m") is None
    assert _partition_key(KEYED, "kb") is None


@pytest.mark.parametrize(
    ("op_id", "key"), [("w", "city"), ("g", "sensor"), ("dd", "id"), ("j", "city")]
)
def test_keyed_operators_take_records_by_their_key(op_id: str, key: str) -> None:
    assert _partition_key(KEYED, op_id) == key


@pytest.mark.parametrize("op_id", ["top", "all"])
def test_operators_that_need_every_record_cannot_run_in_parallel(op_id: str) -> None:
    with pytest.raises(ExecutionError, match=f"operator '{op_id}'.*cannot run as several"):
        _partition_key(KEYED, op_id)


def held_back_segment() -> tuple[Segment, _Item]:
    """A segment whose only queued batch of channel (src, q) was held back by barrier
    alignment: the inbox is empty, the batch waits in ``held``."""
    seg = Segment(["a"], executor=None)  # type: ignore[arg-type]  # never run here
    batch = _Item("src", [{"ts": 1}], [], sender="q")
    _append(seg, batch)
    seg.held.append(seg.inbox.popleft())
    return seg, batch


def test_a_batch_never_joins_one_held_back_by_barrier_alignment() -> None:
    seg, held = held_back_segment()
    assert not seg.inbox
    assert _mergeable(seg, _Item("src", [{"ts": 2}], [], sender="q"), 100) is None
    assert held.records == [{"ts": 1}]


def test_a_batch_joins_the_queued_batch_of_its_channel_with_room() -> None:
    seg = Segment(["a"], executor=None)  # type: ignore[arg-type]
    first = _Item("src", [{"ts": 1}], [], sender="q")
    _append(seg, first)
    assert _mergeable(seg, _Item("src", [{"ts": 2}], [], sender="q"), 2) is first
    assert _mergeable(seg, _Item("src", [{"ts": 2}, {"ts": 3}], [], sender="q"), 2) is None
    assert _mergeable(seg, _Item("src", [{"ts": 2}], [], sender="other"), 2) is None


# -- wire forms ---------------------------------------------------------------------------

DEPLOYMENT = Deployment(
    app_id="t-abc123",
    spec=CHAIN,
    hosts={"src": ("p",), "a": ("p", "q"), "b": ("q",), "c": ("q",), "d": ("p",), "out": ("p",)},
    addresses={"p": ("127.0.0.2", 4000), "q": ("127.0.0.3", 4000)},
    scheduler=("127.0.0.2", 4000),
)


def test_a_deployment_survives_its_wire_form() -> None:
    wire = msgpack.unpackb(msgpack.packb(DEPLOYMENT.to_wire()))
    assert Deployment.from_wire(wire, parse_spec) == DEPLOYMENT


def _without(key: str) -> dict[str, Any]:
    return {k: v for k, v in DEPLOYMENT.to_wire().items() if k != key}


@pytest.mark.parametrize(
    "wire",
    [
        _without("app_id"),
        _without("hosts"),
        _without("scheduler"),
        {**DEPLOYMENT.to_wire(), "hosts": ["src", "p"]},
        {**DEPLOYMENT.to_wire(), "hosts": {"a": 5}},
        {**DEPLOYMENT.to_wire(), "addresses": {"p": ["127.0.0.2", "port"]}},
        {**DEPLOYMENT.to_wire(), "addresses": {"p": "x"}},
        {**DEPLOYMENT.to_wire(), "scheduler": []},
        {**DEPLOYMENT.to_wire(), "scheduler": None},
    ],
    ids=[
        "no-app-id",
        "no-hosts",
        "no-scheduler",
        "hosts-list",
        "hosts-int",
        "port-text",
        "address-text",
        "scheduler-empty",
        "scheduler-none",
    ],
)
def test_a_malformed_deployment_is_an_execution_error(wire: dict[str, Any]) -> None:
    with pytest.raises(ExecutionError, match="malformed deployment"):
        Deployment.from_wire(wire, parse_spec)


def test_a_deployment_with_an_invalid_spec_is_a_spec_error() -> None:
    wire = {**DEPLOYMENT.to_wire(), "spec": {"name": "t", "sources": "nope"}}
    with pytest.raises(SpecError):
        Deployment.from_wire(wire, parse_spec)


RECORD = AppRecord(
    app_id="t-abc123",
    name="t",
    spec=CHAIN.to_dict(),
    state="running",
    scheduler=("127.0.0.2", 4000),
    scheduler_name="p",
    submitted_at=1700000000.5,
    placement={"a": ["p", "q"], "b": ["q"]},
    sources={"src": "p"},
    sinks={"out": "p"},
    paths=[["p", "q", "p"]],
    addresses={"p": ["127.0.0.2", 4000], "q": ["127.0.0.3", 4000]},
)


STATE = {
    "peer": "q",
    "ops": ["b"],
    "instance": "b@q",
    "holders": [["p", ["127.0.0.2", 4000]]],
    "m": 1,
    "k": 0,
    "bytes": 10,
}
COMMIT = {"epoch": 3, "sources": {"src": 10}, "sinks": {"out": 7}, "states": [STATE]}


def test_an_app_record_with_a_commit_survives_its_wire_form() -> None:
    rec = AppRecord(**{**vars(RECORD), "checkpoint": COMMIT, "checkpoints": 3})
    wire = msgpack.unpackb(msgpack.packb(rec.to_wire()))
    assert AppRecord.from_wire(wire) == rec


def test_an_app_record_survives_its_wire_form() -> None:
    wire = msgpack.unpackb(msgpack.packb(RECORD.to_wire()))
    assert AppRecord.from_wire(wire) == RECORD
    assert AppRecord.from_wire({**wire, "from_a_later_version": 1}) == RECORD


@pytest.mark.parametrize(
    "raw",
    [
        None,
        ["t"],
        {"app_id": "t"},
        {k: v for k, v in RECORD.to_wire().items() if k != "scheduler"},
        {**RECORD.to_wire(), "scheduler": "127.0.0.2:4000"},
        {**RECORD.to_wire(), "state": 5},
        {**RECORD.to_wire(), "final": ["not", "stats"]},
        {**RECORD.to_wire(), "addresses": {"p": ["127.0.0.2"]}},
        {**RECORD.to_wire(), "addresses": {"p": ["127.0.0.2", "port"]}},
        {**RECORD.to_wire(), "checkpoint": {"epoch": 3}},
        {**RECORD.to_wire(), "checkpoint": {**COMMIT, "epoch": "3"}},
        {**RECORD.to_wire(), "checkpoint": {**COMMIT, "states": [{"peer": "p"}]}},
        {**RECORD.to_wire(), "checkpoint": {**COMMIT, "states": [{**STATE, "holders": [["q"]]}]}},
    ],
    ids=[
        "none",
        "list",
        "partial",
        "no-scheduler",
        "scheduler-text",
        "state-int",
        "final-list",
        "address-short",
        "port-text",
        "commit-partial",
        "commit-epoch-text",
        "commit-state-partial",
        "commit-holder-short",
    ],
)
def test_a_malformed_app_record_is_a_typed_error(raw: Any) -> None:
    with pytest.raises(UnknownApp, match="app record"):
        AppRecord.from_wire(raw)


def test_status_totals_add_up_the_peers_statistics() -> None:
    stats: dict[str, Any] = {
        "p": {
            "uptime_s": 2.0,
            "sources": {"src": {"emitted": 100, "delayed": 3, "shed": 1}},
            "operators": {"a": {"late": 1, "errors": 0}, "d": {"late": 0, "errors": 2}},
            "sinks": {
                "out": {"records": 90, "dropped": 4, "errors": 1, "latency_recent_ms": [9.0, 1.0]}
            },
        },
        "q": {
            "uptime_s": 4.0,
            "operators": {"b": {"late": 2, "errors": 5}},
            "sinks": {"more": {"records": 10, "latency_recent_ms": [7.0, 5.0, 3.0]}},
        },
        "r": "not statistics",
    }
    view = status_view(RECORD, stats)
    assert view["totals"] == {
        "source_records": 100,
        "sink_records": 100,
        "delayed": 3,
        "shed": 1,
        "late": 3,
        "errors": 8,  # operators' and sinks'
        "dropped": 4,
        "source_rate": 25.0,
        "latency_p50_ms": 5.0,  # of every sink's recent latencies, merged
        "latency_p99_ms": 9.0,
        "latency_samples": 5,
    }
    assert view["state"] == "running"
    assert view["placement"] == RECORD.placement
    assert "latency_recent_ms" not in view["peers"]["p"]["sinks"]["out"]
    assert view["peers"]["p"]["sinks"]["out"]["records"] == 90
    # the raw samples stay with the statistics: a second view (a later `status` of a
    # finished app, from its stored final statistics) sees them again
    assert stats["p"]["sinks"]["out"]["latency_recent_ms"] == [9.0, 1.0]
    assert status_view(RECORD, stats)["totals"] == view["totals"]


def test_an_operator_on_several_peers_adds_up_in_the_totals() -> None:
    # a scaled-out stateless operator runs on two peers: both instances' counters count
    stats: dict[str, Any] = {
        "p": {"operators": {"a": {"late": 1, "utilization": 0.2}}},
        "q": {"operators": {"a": {"late": 2, "utilization": 0.9}, "b": "garbage"}},
    }
    assert status_view(RECORD, stats)["totals"]["late"] == 3


def test_an_operators_statistics_merge_counters_and_keep_the_busiest_measures() -> None:
    error = {"type": "KeyError", "message": "'t'", "record": "{}", "count": 2}
    merged = merged_operator(
        merged_operator(None, {"records_in": 5, "instances": 1, "utilization": 0.1}),
        {
            "records_in": 7,
            "instances": 2,
            "utilization": 0.8,
            "health": 0.4,
            "recent_errors": [error, {"bad": "error"}],
        },
    )
    assert merged["records_in"] == 12
    assert merged["instances"] == 3
    assert merged["utilization"] == 0.8
    assert merged["health"] == 0.4
    assert merged["recent_errors"] == [error]


def test_commits_are_told_to_logged_sources_and_two_phase_sinks_wherever_they_run() -> None:
    """An mqtt source holds its PUBACKs until an epoch commits: a source whose peer ran
    no two-phase sink never heard of commits, and ingest stopped at 65,535 messages."""
    spec = parse_spec(
        {
            "name": "t",
            "checkpoint": {"mode": "erasure"},
            "sources": [
                {
                    "id": "in",
                    "peer": "sensor-1",
                    "connector": "mqtt",
                    "params": {"qos": 1, "topic": "t/#"},
                },
                {
                    "id": "hook",
                    "peer": "sensor-2",
                    "connector": "http",
                    "params": {"port": 8080, "token_env": "T"},
                },
                {
                    "id": "gen",
                    "peer": "edge-3",
                    "connector": "generator",
                    "params": {"dataset": "urban", "rate": 10, "count": 10},
                },
            ],
            "sinks": [
                {
                    "id": "db",
                    "peer": "gateway-1",
                    "connector": "sql",
                    "params": {"table": "t"},
                    "inputs": ["in"],
                },
                {
                    "id": "file",
                    "peer": "gateway-2",
                    "connector": "file",
                    "params": {"path": "out.jsonl"},
                    "inputs": ["hook", "gen"],
                },
            ],
        }
    )
    rec = dataclasses.replace(RECORD, sources={"in": "edge-1", "hook": "sensor-2"})
    rec.sinks = {"db": "edge-2", "file": "gateway-2"}  # "in" and "db" moved
    assert told_of_commits(spec, rec) == {"edge-1", "sensor-2", "edge-2"}


def test_status_of_an_app_without_statistics_has_zero_totals() -> None:
    totals = status_view(RECORD, {})["totals"]
    assert totals["source_records"] == totals["sink_records"] == 0
    assert totals["source_rate"] == 0.0
    assert totals["latency_p50_ms"] is None
    assert totals["latency_samples"] == 0


async def test_registered_code_that_exits_at_run_time_is_a_bad_record(tmp_path: Path) -> None:
    from agiledart.local.executor import Executor

    store = CodeStore(None, tmp_path)
    code_id = await store.register(b"def leave(r):\n    raise SystemExit(5)\n")
    spec = spec_of([{"id": "m", "op": "map", "fn": f"{code_id}:leave", "inputs": ["src"]}], ["m"])
    executor = Executor(spec, store.resolver(), operators=["m"])
    executor.feed("src", [{"ts": 1}])
    assert executor.operators["m"].stats.errors == 1


# -- bundles -------------------------------------------------------------------------------


def test_a_package_bundle_is_canonical_whatever_the_order_of_its_files() -> None:
    files = {"__init__.py": b"from .util import twice\n", "util.py": b"def twice(r): return r\n"}
    a = Bundle.package("tools", files)
    b = Bundle.package("tools", dict(reversed(files.items())))
    assert a.code_id == b.code_id
    assert Bundle.from_content("package", "tools", a.content) == a
    assert Bundle.package("tools", {**files, "util.py": b"# changed\n"}).code_id != a.code_id


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"util.py": b""}, "no __init__.py"),
        ({"__init__.py": b"", "../escape.py": b""}, "must be relative"),
        ({"__init__.py": b"", "/abs.py": b""}, "must be relative"),
    ],
)
def test_bad_package_bundles_are_refused(files: dict[str, bytes], message: str) -> None:
    with pytest.raises(CodeError, match=message):
        Bundle.package("tools", files)


def test_a_corrupt_archive_is_a_code_error() -> None:
    with pytest.raises(CodeError, match="corrupt archive"):
        Bundle.from_content("package", "tools", b"\x93garbage")


async def test_a_package_loads_with_relative_imports(tmp_path: Path) -> None:
    src = tmp_path / "tools"
    (src / "sub").mkdir(parents=True)
    (src / "__init__.py").write_text("from .sub.scale import triple\n")
    (src / "sub" / "__init__.py").write_text("")
    (src / "sub" / "scale.py").write_text("def triple(r):\n    return {**r, 'v': 3 * r['v']}\n")
    (src / "__pycache__").mkdir()
    (src / "__pycache__" / "junk.pyc").write_bytes(b"\0")
    bundle = Bundle.from_path(src)
    assert [p for p, _ in bundle.files] == ["__init__.py", "sub/__init__.py", "sub/scale.py"]
    store = CodeStore(None, tmp_path / "cache")
    code_id, stored = await store.register_bundle(bundle)
    assert not stored  # no records store here
    fresh = CodeStore(None, tmp_path / "cache")  # from the disk cache
    await fresh.fetch([code_id])
    assert fresh.resolver()(f"{code_id}:triple")({"v": 2}) == {"v": 6}


async def test_queries_of_one_bundle_share_its_code_object(tmp_path: Path) -> None:
    """Pluto's query groups: two queries with different parameters bind two functions
    over the one loaded module of their bundle."""
    from agiledart.app.functions import bind

    store = CodeStore(None, tmp_path)
    code_id = await store.register(
        b"from agiledart.app import factory\n\n\n@factory\ndef keep(*, threshold=0):\n"
        b"    return lambda r: r['v'] > threshold\n"
    )
    resolve = store.resolver()
    low = bind(resolve(f"{code_id}:keep"), {"threshold": 1})
    high = bind(resolve(f"{code_id}:keep"), {"threshold": 10})
    assert low({"v": 5})
    assert not high({"v": 5})
    assert low.__globals__ is high.__globals__  # one module, one code object
    assert store.loaded == 1
