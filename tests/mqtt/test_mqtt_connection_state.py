"""An mqtt source and an mqtt sink pointed at a port no broker listens on: ``status``
says each is ``retrying``, since when, and why (the connection refused), in ``--json``
and in plain text. Before, ``status`` said ``running``, ``0 in``, and only the peer's log said why.

Real peer processes; no broker at all (the port is free on purpose)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.processes import cli, cli_json, formed_cluster, free_port, poll

pytestmark = [pytest.mark.processes]


def test_a_source_that_cannot_reach_its_broker_shows_retrying_with_the_error(
    tmp_path: Path,
) -> None:
    port = free_port()  # nothing listens there
    spec = {
        "name": "unreachable",
        "sources": [
            {
                "id": "plant",
                "peer": "sensor-1",
                "connector": "mqtt",
                "params": {"broker": f"127.0.0.1:{port}", "topic": "plant/#", "qos": 1},
            }
        ],
        "sinks": [
            {"id": "out", "peer": "sensor-1", "connector": "discard", "inputs": ["plant"]},
            {
                "id": "alerts",
                "peer": "sensor-1",
                "connector": "mqtt",
                "params": {"broker": f"127.0.0.1:{port}", "topic": "alerts/x", "qos": 1},
                "inputs": ["plant"],
            },
        ],
    }
    with formed_cluster(tmp_path, 1, ["--workers", "0"]) as alone:
        assert alone.workdir is not None
        path = alone.workdir / "unreachable.json"
        path.write_text(json.dumps(spec))
        via = ["--via", "{}:{}".format(*alone.address(0))]
        app_id = cli_json(alone, "submit", str(path), *via)["app_id"]

        def retrying() -> dict[str, object] | None:
            s = cli_json(alone, "status", app_id, *via)
            source = s["peers"]["sensor-1"]["sources"]["plant"]
            return source if source["connection"] == "retrying" else None

        source = poll(retrying, what="the source to say it is retrying", timeout=60)
        assert "refused" in str(source["last_error"]).lower()
        assert isinstance(source["retrying_since"], float)

        def sink_retrying() -> dict[str, object] | None:
            s = cli_json(alone, "status", app_id, *via)
            sink = s["peers"]["sensor-1"]["sinks"]["alerts"]
            return sink if sink["connection"] == "retrying" else None

        sink = poll(sink_retrying, what="the mqtt sink to say it is retrying", timeout=60)
        assert "refused" in str(sink["last_error"]).lower()
        text = cli(alone, "status", app_id, *via).stdout
        assert "  source plant @ sensor-1: retrying since " in text
        assert "  sink alerts @ sensor-1: retrying since " in text
        assert "refused" in text.lower()
