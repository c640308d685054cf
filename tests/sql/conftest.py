from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.postgres import Postgres, remove, start_postgres


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    """One PostgreSQL cluster for the session's sql tests (each makes its own database)."""
    pg = start_postgres()
    try:
        yield pg
    finally:
        remove(pg)
