"""Registered bundles on real peers: stored once, fetched by peers that never saw them,
corrupt ones refused at submission."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.processes import cli, cli_json, formed_cluster

from agiledart.app import parse_spec
from agiledart.emulation import LocalCluster
from agiledart.local.reference import canonical, reference_outputs
from agiledart.runtime.code import Bundle, CodeStore
from agiledart.runtime.records import record_key

pytestmark = [pytest.mark.processes]


@pytest.fixture(scope="module")
def trio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    # sensor-1, sensor-2, gateway-1; each app scheduled by the peer it is submitted
    # through, so the corrupt-bundle case is validated by a peer that never cached the
    # bundle (a zone scheduler that cached a good copy validates it and the error comes
    # at deployment instead)
    with formed_cluster(tmp_path_factory.mktemp("trio"), 3, ["--scheduling", "local"]) as cluster:
        yield cluster


def via(cluster: LocalCluster, i: int) -> list[str]:
    return ["--via", "{}:{}".format(*cluster.address(i))]


def package(root: Path, factor: int) -> Path:
    pkg = root / f"scaling{factor}"
    (pkg / "ops").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .ops.scale import times\n")
    (pkg / "ops" / "__init__.py").write_text("")
    (pkg / "ops" / "scale.py").write_text(
        "from agiledart.app import factory\n\n\n"
        "@factory\n"
        "def times(*, field='value', k=1):\n"
        "    def f(r):\n"
        "        return {**r, field: r[field] * k}\n"
        "    return f\n"
        f"FACTOR = {factor}\n"
    )
    return pkg


def stored(cluster: LocalCluster) -> int:
    return sum(cli_json(cluster, "ring", *via(cluster, i))["records"]["count"] for i in range(3))


def settled(cluster: LocalCluster, timeout_s: float = 60.0) -> int:
    """The records stored over the ring once the count stays the same for a second: a
    ring just formed, or a record just written, is still copied to its holders for a
    while (longer on a loaded machine)."""
    deadline = time.monotonic() + timeout_s
    last = stored(cluster)
    while time.monotonic() < deadline:
        time.sleep(1.0)
        now = stored(cluster)
        if now == last:
            return now
        last = now
    return last


def test_registering_the_same_bundle_twice_stores_it_once(
    trio: LocalCluster, tmp_path: Path
) -> None:
    pkg = package(tmp_path, 2)
    first = cli_json(trio, "register", str(pkg), *via(trio, 1))
    assert first["stored"] is True
    assert first["code_id"] == Bundle.from_path(pkg).code_id
    before = settled(trio)
    again = cli_json(trio, "register", str(pkg), *via(trio, 2))  # another peer, same bytes
    assert again == {**first, "stored": False}
    assert settled(trio) == before


APP = """
name: scaled
sources:
  - {id: src, peer: sensor-1, connector: generator,
     params: {dataset: urban, rate: 2000, count: 3000, seed: 3, speedup: 4}}
operators:
  - {id: scaled, op: map, fn: "CODE:times", params: {field: value, k: 3}, inputs: [src]}
sinks:
  - {id: out, peer: gateway-1, connector: file, params: {path: scaled.jsonl}, inputs: [scaled]}
"""


def test_a_peer_that_never_saw_a_bundle_fetches_it(trio: LocalCluster, tmp_path: Path) -> None:
    pkg = package(tmp_path, 3)
    code_id = cli_json(trio, "register", str(pkg), *via(trio, 1))["code_id"]  # at sensor-2
    text = APP.replace("CODE", code_id)
    spec_file = tmp_path / "scaled.yaml"
    spec_file.write_text(text)
    status = cli_json(trio, "submit", str(spec_file), "--wait", *via(trio, 1))
    assert status["state"] == "finished", status.get("error")
    host = status["placement"]["scaled"][0]
    assert host != "sensor-2"  # the operator ran where the bundle was never registered
    assert trio.workdir is not None
    assert (trio.workdir / host / "code" / f"{code_id}.bundle").is_file()
    sink = status["peers"]["gateway-1"]["sinks"]["out"]
    got = [json.loads(x) for x in Path(sink["path"]).read_text().splitlines()]
    store = CodeStore(None, tmp_path / "local")
    asyncio.run(store.register_bundle(Bundle.from_path(pkg)))
    want = reference_outputs(parse_spec(text), store.resolver())["out"]
    assert canonical(got) == canonical(json.loads(json.dumps(want)))


def test_a_corrupt_bundle_fails_the_submission(trio: LocalCluster, tmp_path: Path) -> None:
    pkg = package(tmp_path, 5)
    bundle = Bundle.from_path(pkg)
    code_id = cli_json(trio, "register", str(pkg), *via(trio, 1))["code_id"]
    chunk = hashlib.sha256(bundle.content).hexdigest()  # one chunk: small bundle
    garbage: dict[str, Any] = {
        "k": f"{record_key('chunk', chunk):040x}",
        "v": 2**62,  # newer than anything: every copy is replaced
        "value": b"not the chunk",
    }

    async def corrupt() -> None:
        for i in range(3):
            await trio.request(i, "kv_put", garbage)

    asyncio.run(corrupt())
    spec_file = tmp_path / "corrupt.yaml"
    spec_file.write_text(APP.replace("CODE", code_id))
    proc = cli(trio, "submit", str(spec_file), *via(trio, 2), check=False)  # gateway-1
    assert proc.returncode == 1
    assert f"chunk {chunk[:12]}... is corrupt" in proc.stderr
    assert "operators[0].fn" in proc.stderr
    # sensor-2 registered the bundle and validates with its good cached copy; the
    # host the operator is placed on (on the JOIN path, never sensor-2) downloads the
    # corrupt chunk at deployment: the error still names the field
    proc = cli(trio, "submit", str(spec_file), *via(trio, 1), check=False)
    assert proc.returncode == 1
    assert f"chunk {chunk[:12]}... is corrupt" in proc.stderr
    assert "operators[0].fn" in proc.stderr
