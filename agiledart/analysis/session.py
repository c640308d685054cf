"""Starting Spark: the one place pyspark's start-up failures become ours (STYLE.md 2).

``agiledart analyze`` runs Spark in local mode (``local[2]``, 3 GB of heap) unless
given a master URL, or uses the session already active in the process
(``spark-submit``). Spark's own logging is turned down to errors (a log4j2 file written
for the run), its console progress bar and web UI are off, so what the user sees on
stderr is ours. The reader's tasks run in Spark's Python workers: a local run starts
them with this interpreter (``PYSPARK_PYTHON`` unless already set), where agiledart and
pyarrow are installed; on a cluster the workers need both too.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import sys
import tempfile
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from agiledart.analysis.errors import SparkUnavailableError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["LOCAL_MASTER", "require_analysis_extra", "spark_session"]

LOCAL_MASTER = "local[2]"

_INSTALL = "install the analysis extra: pip install 'agiledart[analysis]'"

_LOG4J = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = spark %p %c{1}: %m%n
# PySpark counts as a shell: Spark prints "Setting default log level to WARN" unless
# the logger of the class that first logs has a level of its own, equal to the root's
logger.spark.name = org.apache.spark
logger.spark.level = error
"""

#: Spark generates one Java method per stage of a query, which can be larger than the
#: 8000 bytes HotSpot compiles by default (interpreted, it runs two to three times
#: slower); and the parallel garbage collector, whose pauses cost the jobs less on two
#: cores than G1's concurrent threads (10 million trace rows: jobs 42 s with G1, 32 s)
_JVM = "-XX:-DontCompileHugeMethods -XX:+UseParallelGC"
#: the driver's JIT stops at the client compiler (C1): it plans and generates code for
#: every query, work that is over before C2's optimising compiles pay off, and in local
#: mode C2's compiler threads took the second core (the analysis of 20,000 or 2 million
#: trace lines on local[2]: 21-22% less CPU). A cluster's executors keep C2.
_DRIVER_JVM = "-XX:TieredStopAtLevel=1"

#: shuffle partitions per core of the cluster, unless ``spark.sql.shuffle.partitions`` is given
PARTITIONS_PER_CORE = 4

#: the Python workers' environment when their memory is limited
LIMITED_PYTHON_ENV = {"ARROW_DEFAULT_MEMORY_POOL": "system", "MALLOC_ARENA_MAX": "2"}

#: defaults for a local run; ``conf`` given to :func:`spark_session` overrides them
LOCAL_DEFAULTS: dict[str, str] = {
    "spark.driver.memory": "3g",
    "spark.sql.shuffle.partitions": "2",
}
DEFAULTS: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
}


def require_analysis_extra() -> None:
    """Raise :class:`SparkUnavailableError` unless pyspark, pyarrow (results come back
    through Arrow) and matplotlib import."""
    for module in ("pyspark", "pyarrow", "matplotlib"):
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            msg = f"{module} is not installed; {_INSTALL}"
            raise SparkUnavailableError(msg)
    # pyspark 4.x warns once about pandas >= 3, which the analysis does not use
    warnings.filterwarnings("ignore", "PySpark does not yet fully support pandas", FutureWarning)


@contextlib.contextmanager
def spark_session(
    master: str | None = None, conf: Mapping[str, str] | None = None
) -> Iterator[SparkSession]:
    """A Spark session for one analysis: the active one if there is one (under
    ``spark-submit``, in a notebook, in tests), else a new one, stopped on exit."""
    require_analysis_extra()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    from pyspark.errors import PySparkException
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        yield active
        return

    if master is None or master.startswith("local"):
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    settings = {**DEFAULTS, **(LOCAL_DEFAULTS if master is None else {}), **(conf or {})}
    if "spark.executor.pyspark.memory" in settings:
        # a limit on the Python workers' address space: allocators that reserve little
        # more than they use (Arrow's own pool and glibc's per-thread arenas reserve
        # hundreds of MB that the limit counts)
        for key, value in LIMITED_PYTHON_ENV.items():
            settings.setdefault(f"spark.executorEnv.{key}", value)
    with tempfile.TemporaryDirectory(prefix="agiledart-spark-") as tmp:
        log4j = Path(tmp) / "log4j2.properties"
        log4j.write_text(_LOG4J)
        for side, options in (
            ("driver", f"{_JVM} {_DRIVER_JVM} -Dlog4j2.configurationFile=file:{log4j}"),
            ("executor", _JVM),
        ):
            extra = settings.get(f"spark.{side}.extraJavaOptions")
            settings[f"spark.{side}.extraJavaOptions"] = f"{extra} {options}" if extra else options
        builder = SparkSession.builder.master(master or LOCAL_MASTER).appName("agiledart-analyze")
        for key, value in settings.items():
            builder = builder.config(key, value)
        logging.getLogger("agiledart.analysis").info(
            "starting Spark (%s; a few seconds)", master or LOCAL_MASTER
        )
        try:
            spark = builder.getOrCreate()
        except (PySparkException, OSError) as exc:
            msg = f"Spark did not start ({exc}); it needs Java 17 or newer (JAVA_HOME)"
            raise SparkUnavailableError(msg) from exc
        try:
            spark.sparkContext.setLogLevel("ERROR")
            if "spark.sql.shuffle.partitions" not in settings:
                # Spark's 200 makes 200 tasks of every merge of a few thousand groups;
                # a few per core, spilled when large (set it higher for huge traces)
                partitions = max(2, PARTITIONS_PER_CORE * spark.sparkContext.defaultParallelism)
                spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
            yield spark
        finally:
            spark.stop()
