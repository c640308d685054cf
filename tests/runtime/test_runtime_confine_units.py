"""A peer's data policy without a peer: which file paths a spec's sources and sinks may
use, which environment variables its ``password_env`` may read, and a resumed file sink
that finds less than its checkpoint committed."""

from __future__ import annotations

from pathlib import Path

import pytest

from agiledart.app.errors import ExecutionError
from agiledart.app.spec import SinkSpec, SourceSpec
from agiledart.runtime.confine import DataPolicy, EnvNotAllowed, PathNotAllowed
from agiledart.runtime.connectors import FileSink, SinkOutputLost, open_sink, open_source


def policy(tmp_path: Path) -> DataPolicy:
    (tmp_path / "root").mkdir()
    (tmp_path / "extra").mkdir()
    return DataPolicy.of(
        tmp_path / "root", allow_paths=[tmp_path / "extra"], allow_env=["SITE_BROKER_PW"]
    )


def sink(path: str, connector: str = "file", **params: object) -> SinkSpec:
    return SinkSpec(
        id="out", peer="p", connector=connector, inputs=("x",), params={"path": path, **params}
    )


def test_sources_read_inside_the_data_root_or_an_allowed_folder(tmp_path: Path) -> None:
    p = policy(tmp_path)
    root = p.root
    assert p.source_path("source 's'", "in/a.csv") == root / "in" / "a.csv"
    assert p.source_path("source 's'", str(root / "b.csv")) == root / "b.csv"
    assert p.source_path("source 's'", str(tmp_path / "extra" / "c.csv")).name == "c.csv"
    for outside in ("/etc/passwd", "../x.csv", "in/../../extra2/x.csv", str(tmp_path / "x")):
        with pytest.raises(PathNotAllowed, match="--allow-path"):
            p.source_path("source 's'", outside)


def test_a_symbolic_link_does_not_lead_out(tmp_path: Path) -> None:
    p = policy(tmp_path)
    (p.root / "out").symlink_to(tmp_path)
    with pytest.raises(PathNotAllowed, match="outside the data root"):
        p.source_path("source 's'", "out/secret")


def test_sinks_write_under_the_output_folder_never_over_the_state(tmp_path: Path) -> None:
    p = policy(tmp_path)
    out_dir = p.sink_dir("app-1")
    assert p.sink_path("sink 'k'", "a/b.jsonl", out_dir) == p.output / "app-1" / "a" / "b.jsonl"
    assert p.sink_path("sink 'k'", "../app-2/c.jsonl", out_dir) == p.output / "app-2" / "c.jsonl"
    extra = tmp_path / "extra" / "d.jsonl"
    assert p.sink_path("sink 'k'", str(extra), out_dir) == extra.resolve()
    for outside in ("../../node_id", "../../code/x.py", "/tmp/x.jsonl", str(tmp_path / "y")):
        with pytest.raises(PathNotAllowed, match="sink 'k' writes"):
            p.sink_path("sink 'k'", outside, out_dir)
    with pytest.raises(PathNotAllowed):  # open_sink refuses it before creating anything
        open_sink(sink("/tmp/agiledart-confine-never.jsonl"), out_dir=out_dir, policy=p)
    assert not Path("/tmp/agiledart-confine-never.jsonl").exists()


def test_specs_read_only_the_secret_variables_and_the_allowed_ones(tmp_path: Path) -> None:
    p = policy(tmp_path)
    p.check_env("source 's'", "AGILEDART_SECRET_BROKER")
    p.check_env("source 's'", "SITE_BROKER_PW")
    for name in ("HOME", "AGILEDART_SECRET_", "AWS_SECRET_ACCESS_KEY", "agiledart_secret_x"):
        with pytest.raises(EnvNotAllowed, match=f"--allow-env {name}"):
            p.check_env("source 's'", name)
    mqtt = SourceSpec(
        id="s", peer="p", connector="mqtt", params={"topic": "t", "password_env": "HOME"}
    )
    with pytest.raises(EnvNotAllowed, match="source 's': password_env names 'HOME'"):
        open_source(mqtt, base_dir=tmp_path, brokers=object(), policy=p)  # type: ignore[arg-type]
    with pytest.raises(EnvNotAllowed, match="sink 'out'"):
        open_sink(
            sink("x", connector="mqtt", topic="t", password_env="HOME"),
            out_dir=tmp_path,
            brokers=object(),  # type: ignore[arg-type]
            policy=p,
        )


def test_a_file_source_outside_the_root_is_refused_when_made(tmp_path: Path) -> None:
    p = policy(tmp_path)
    spec = SourceSpec(id="s", peer="p", connector="file", params={"path": "/etc/hostname"})
    with pytest.raises(PathNotAllowed, match="source 's' reads '/etc/hostname'"):
        open_source(spec, base_dir=p.root, policy=p)
    (p.root / "in.jsonl").write_text('{"ts": 1}\n')
    inside = SourceSpec(id="s", peer="p", connector="file", params={"path": "in.jsonl"})
    assert open_source(inside, base_dir=tmp_path / "ignored", policy=p).spec is inside


def test_a_resumed_sink_shorter_than_its_commit_is_refused_not_padded(tmp_path: Path) -> None:
    spec = sink("o.jsonl")
    first = FileSink(spec, out_dir=tmp_path)
    first.write([{"a": 1}, {"a": 2}])
    committed = first.commit()
    first.close()
    path = tmp_path / "o.jsonl"
    whole = path.read_bytes()
    path.write_bytes(whole[:5])  # output lost behind the peer's back
    with pytest.raises(SinkOutputLost, match=f"holds 5 bytes, .* committed {len(whole)}"):
        FileSink(spec, out_dir=tmp_path, resume=committed)
    assert path.read_bytes() == whole[:5]  # left as found, no NUL bytes
    path.unlink()
    with pytest.raises(SinkOutputLost, match="holds 0 bytes"):
        open_sink(spec, out_dir=tmp_path, resume=committed)
    assert isinstance(SinkOutputLost("x"), ExecutionError)
    nothing = FileSink(spec, out_dir=tmp_path, resume={"size": 0, "records": 0})
    nothing.close()  # a checkpoint before any output: nothing was lost
