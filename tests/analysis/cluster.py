"""A Spark standalone cluster on loopback, started from the installed pyspark's own
``bin/spark-class``: one master and workers, each a process of its own, stopped after."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Cluster", "standalone_cluster"]

_START_S = 90.0


@dataclass(frozen=True)
class Cluster:
    master: str
    """``spark://127.0.0.1:PORT``"""
    logs: Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _spark_class() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "bin" / "spark-class"


def _wait(
    what: str, ready: Callable[[], bool], procs: list[subprocess.Popen[bytes]], logs: Path
) -> None:
    deadline = time.monotonic() + _START_S
    while not ready():
        dead = [p for p in procs if p.poll() is not None]
        if dead or time.monotonic() > deadline:
            tails = "\n".join(f.read_text()[-2000:] for f in sorted(logs.glob("*.log")))
            msg = f"the standalone cluster's {what} did not come up:\n{tails}"
            raise RuntimeError(msg)
        time.sleep(0.3)


@contextlib.contextmanager
def standalone_cluster(
    directory: Path, workers: int = 2, cores: int = 1, memory: str = "1g"
) -> Iterator[Cluster]:
    """A master and ``workers`` workers (``cores`` and ``memory`` each) on 127.0.0.1."""
    logs = directory / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_NO_DAEMONIZE": "1"}
    env.pop("SPARK_HOME", None)
    port = _free_port()
    master = f"spark://127.0.0.1:{port}"
    procs: list[subprocess.Popen[bytes]] = []

    def start(name: str, *args: str) -> Path:
        log = logs / f"{name}.log"
        with log.open("wb") as out:
            procs.append(
                subprocess.Popen(
                    [str(_spark_class()), *args],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=directory,
                    start_new_session=True,
                )
            )
        return log

    try:
        master_log = start(
            "master",
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--webui-port",
            str(_free_port()),
        )
        for i in range(workers):
            work = directory / f"worker-{i}"
            work.mkdir(exist_ok=True)
            start(
                f"worker-{i}",
                "org.apache.spark.deploy.worker.Worker",
                master,
                "--host",
                "127.0.0.1",
                "--cores",
                str(cores),
                "--memory",
                memory,
                "--webui-port",
                str(_free_port()),
                "--work-dir",
                str(work),
            )

        def registered() -> bool:
            text = master_log.read_text(errors="replace")
            return len(re.findall(r"Registering worker", text)) >= workers

        _wait("workers", registered, procs, logs)
        yield Cluster(master=master, logs=logs)
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, 15)
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, 9)
                proc.wait()
