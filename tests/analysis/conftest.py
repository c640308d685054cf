"""One local Spark session for every test of the analysis (a JVM takes seconds to start)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("pyspark", reason="the analysis extra is not installed")
pytest.importorskip("matplotlib", reason="the analysis extra is not installed")


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from agiledart.analysis.session import spark_session

    with spark_session(conf={"spark.sql.shuffle.partitions": "2"}) as session:
        yield session
