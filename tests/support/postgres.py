"""A throwaway PostgreSQL cluster on loopback for the sql sink's tests (fixture
``postgres`` in ``tests/sql/conftest.py``, one per test session).

``initdb`` refuses to run as root, so as root the cluster belongs to the ``postgres``
user (Debian's package makes it) and its commands run through ``runuser``. It listens
on 127.0.0.1 at a free port with its socket in its own folder, password
authentication (scram) over TCP. ``scripts/setup.sh`` installs Debian's
``postgresql``: a machine without it fails these tests loudly instead of skipping them.
"""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from support.processes import free_port

__all__ = ["PASSWORD", "Postgres", "remove", "start_postgres"]

PASSWORD = "agiledart-test-password"


def _bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if not found:
        pytest.fail(
            "the sql sink's tests need PostgreSQL, which is not installed: run `make setup` "
            "(scripts/setup.sh installs it) or `sudo apt-get install postgresql`",
            pytrace=False,
        )
    return found[-1]


@dataclass
class Postgres:
    """One cluster in ``workdir`` on 127.0.0.1:``port``; stop and start it at will."""

    workdir: Path
    port: int
    user: str | None  #: the OS user it runs as (None: this process's)

    @property
    def data(self) -> Path:
        return self.workdir / "data"

    def url(self, db: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{db}"

    def _run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[bytes]:
        cmd = list(argv) if self.user is None else ["runuser", "-u", self.user, "--", *argv]
        return subprocess.run(cmd, check=check, capture_output=True, timeout=60)

    def init(self) -> None:
        pwfile = self.workdir / "pw"
        pwfile.write_text(PASSWORD + "\n")
        if self.user is not None:
            u = pwd.getpwnam(self.user)
            os.chown(self.workdir, u.pw_uid, u.pw_gid)
            os.chown(pwfile, u.pw_uid, u.pw_gid)
        self._run(
            _bin("initdb"), "-D", str(self.data), "-U", "postgres", "--pwfile", str(pwfile),
            "--auth-host=scram-sha-256", "--auth-local=trust", "-E", "UTF8", "--no-sync",
        )  # fmt: skip

    def start(self) -> None:
        opts = f"-k {self.workdir} -p {self.port} -h 127.0.0.1 -c fsync=off"
        self._run(
            _bin("pg_ctl"), "-D", str(self.data), "-o", opts, "-l",
            str(self.workdir / "log"), "-w", "-t", "60", "start",
        )  # fmt: skip

    def stop(self) -> None:
        self._run(_bin("pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop", check=False)

    def query(self, sql: str, db: str = "postgres") -> list[tuple[Any, ...]]:
        with psycopg.connect(self.url(db), password=PASSWORD, autocommit=True) as conn:
            cur = conn.execute(sql)
            return list(cur.fetchall()) if cur.description else []

    def create_db(self, hint: str) -> str:
        """A fresh database named after ``hint`` (unique in the session); its name."""
        name = f"{hint}_{secrets.token_hex(4)}"
        self.query(f'CREATE DATABASE "{name}"')
        return name


def start_postgres() -> Postgres:
    user = "postgres" if os.geteuid() == 0 else None
    if user is not None:
        try:
            pwd.getpwnam(user)
        except KeyError:
            pytest.fail("no user postgres to run the test cluster as (apt-get install postgresql)")
    workdir = Path(tempfile.mkdtemp(prefix="agiledart-pg-"))
    pg = Postgres(workdir, free_port(), user)
    pg.init()
    pg.start()
    return pg


def remove(pg: Postgres) -> None:
    pg.stop()
    shutil.rmtree(pg.workdir, ignore_errors=True)
