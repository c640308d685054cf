"""A real peer confines what submitted specs reach: file sinks and sources outside its
data root (or an --allow-path folder) and a password_env it does not allow fail the app
with a reason naming the option; inside them the app runs as before."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.processes import cli, cli_json, formed_cluster

from agiledart.app import parse_spec
from agiledart.app.errors import ExecutionError
from agiledart.emulation import LocalCluster
from agiledart.runtime.instance import Deployment

pytestmark = [pytest.mark.processes]

PEER = "sensor-1"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, Path]]:
    root = tmp_path_factory.mktemp("confine")
    allowed = root / "allowed"
    allowed.mkdir()
    args = ["--workers", "0", "--allow-path", str(allowed), "--allow-env", "SITE_PW"]
    with formed_cluster(root, 1, args) as cluster:
        yield cluster, allowed


def run(cluster: LocalCluster, name: str, source: dict[str, Any], sink: dict[str, Any]) -> Any:
    """Submit a one-peer app and wait for its end; its final status, or the CLI's error."""
    spec = {
        "name": name,
        "sources": [{"id": "src", "peer": PEER, **source}],
        "operators": [{"id": "m", "op": "map", "fn": "builtin:identity", "inputs": ["src"]}],
        "sinks": [{"id": "out", "peer": PEER, "inputs": ["m"], **sink}],
    }
    assert cluster.workdir is not None
    path = cluster.workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    via = ["--via", "{}:{}".format(*cluster.address(0))]
    proc = cli(cluster, "submit", str(path), "--wait", "--json", *via, check=False)
    if proc.returncode != 0:
        return proc.stderr
    submitted = yaml.safe_load(proc.stdout)
    return cli_json(cluster, "status", submitted["app_id"], *via)


GENERATOR = {"connector": "generator", "params": {"dataset": "urban", "rate": 200, "count": 20}}


def reason(outcome: Any) -> str:
    if isinstance(outcome, str):  # the submit itself was refused
        return outcome
    assert outcome["state"] == "failed", outcome
    return str(outcome["error"])


def test_a_sink_outside_the_data_root_fails_the_app_with_a_reason(
    site: tuple[LocalCluster, Path], tmp_path: Path
) -> None:
    cluster, _ = site
    target = tmp_path / "stolen.jsonl"
    for i, path in enumerate((str(target), "../../../escape.jsonl", "../../node_id")):
        got = reason(run(cluster, f"outside-{i}", GENERATOR, file_sink(path)))
        assert "sink 'out' writes" in got, got
        assert "--allow-path" in got, got
    assert not target.exists()
    state_dir = cluster.workdir / PEER  # type: ignore[operator]
    assert (state_dir / "node_id").read_bytes() != b""  # not overwritten by a sink
    assert not (cluster.workdir / "escape.jsonl").exists()  # type: ignore[operator]


def test_a_source_outside_the_data_root_fails_the_app(site: tuple[LocalCluster, Path]) -> None:
    cluster, _ = site
    source = {"connector": "file", "params": {"path": "/etc/hostname", "format": "csv"}}
    got = reason(run(cluster, "read-etc", source, file_sink("x.jsonl")))
    assert "source 'src' reads '/etc/hostname'" in got, got


def test_a_password_env_the_peer_does_not_allow_fails_the_app(
    site: tuple[LocalCluster, Path],
) -> None:
    cluster, _ = site
    source = {
        "connector": "mqtt",
        "params": {"topic": "t/#", "password_env": "HOME", "username": "u", "count": 1},
    }
    got = reason(run(cluster, "read-home", source, file_sink("y.jsonl")))
    assert "password_env names 'HOME'" in got, got
    assert "--allow-env HOME" in got, got


def test_inside_the_root_or_an_allowed_folder_the_app_runs(
    site: tuple[LocalCluster, Path],
) -> None:
    cluster, allowed = site
    relative = run(cluster, "inside", GENERATOR, file_sink("inside.jsonl"))
    assert relative["state"] == "finished", relative.get("error")
    written = Path(relative["peers"][PEER]["sinks"]["out"]["path"])
    assert written.is_relative_to(cluster.workdir / PEER / "output")  # type: ignore[operator]
    assert len(written.read_text().splitlines()) == 20
    target = allowed / "kept.jsonl"
    absolute = run(cluster, "allowed", GENERATOR, file_sink(str(target)))
    assert absolute["state"] == "finished", absolute.get("error")
    assert len(target.read_text().splitlines()) == 20


def file_sink(path: str) -> dict[str, Any]:
    return {"connector": "file", "params": {"path": path, "format": "jsonl"}}


async def test_a_restore_over_lost_sink_output_is_refused_not_padded(
    site: tuple[LocalCluster, Path],
) -> None:
    """A restored deployment whose sink file holds less than the checkpoint committed is
    refused with the reason (the recovery fails the app with it), and no NUL is written."""
    cluster, _ = site
    app_id = "lost-output-1a2b3c"
    spec = parse_spec(
        yaml.safe_dump(
            {
                "name": "lost-output",
                "sources": [{"id": "src", "peer": PEER, **GENERATOR}],
                "operators": [
                    {"id": "m", "op": "map", "fn": "builtin:identity", "inputs": ["src"]}
                ],
                "sinks": [{"id": "out", "peer": PEER, "inputs": ["m"], **file_sink("o.jsonl")}],
            }
        )
    )
    out = cluster.workdir / PEER / "output" / app_id / "o.jsonl"  # type: ignore[operator]
    out.parent.mkdir(parents=True)
    out.write_bytes(b'{"ts":1}\n')  # 9 bytes left of the 900 committed
    deployment = Deployment(
        app_id=app_id,
        spec=spec,
        hosts={n: (PEER,) for n in ("src", "m", "out")},
        addresses={PEER: cluster.address(0)},
        scheduler=cluster.address(0),
        restore={"epoch": 3, "sinks": {"out": {"size": 900, "records": 50}}},
    )
    with pytest.raises(ExecutionError) as info:  # a SinkOutputLost, crossing as its parent
        await cluster.request(0, "deploy", deployment.to_wire(), timeout=20.0)
    assert "holds 9 bytes, but the checkpoint to resume from committed 900" in str(info.value)
    assert out.read_bytes() == b'{"ts":1}\n'
    assert app_id not in (await cluster.request(0, "ring", {}))["apps"]
