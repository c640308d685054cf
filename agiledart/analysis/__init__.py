"""Offline analysis of peer traces with PySpark (docs/traces.md).

``agiledart analyze TRACE_DIR --out DIR`` reads every peer's trace files in one Spark
job whose tasks parse them with Arrow against each record type's explicit schema
(:mod:`~agiledart.analysis.reader`, :mod:`~agiledart.analysis.parse`), counts and skips
malformed lines, writes the parsed records as Parquet, computes each section with Spark
SQL over all their partitions (:mod:`~agiledart.analysis.sections`,
:mod:`~agiledart.analysis.frames`; only the final tables reach the driver) and writes
CSV tables, PNG plots and ``report.html``:

* :mod:`~agiledart.analysis.metrics`: latency percentiles per app over time, throughput
  per operator;
* :mod:`~agiledart.analysis.routing`: regret curves, path choices and delay CDFs per
  policy and graph, hop attempt outcomes;
* :mod:`~agiledart.analysis.placement`: operators per peer (with a normal-probability
  plot), schedulers per zone;
* :mod:`~agiledart.analysis.timelines`: scaling, recovery, checkpoints, membership.

:mod:`~agiledart.analysis.simulated` turns a regret simulation into traces. pyspark and
matplotlib (the ``analysis`` extra) are imported only when an analysis runs, so this
package imports without them. Exceptions (:mod:`~agiledart.analysis.errors`)::

    AnalysisError(AgiledartError)
    ├── AnalysisUsageError
    └── SparkUnavailableError
"""

from agiledart.analysis.errors import AnalysisError, AnalysisUsageError, SparkUnavailableError
from agiledart.analysis.run import Analysis, analyze

__all__ = ["Analysis", "AnalysisError", "AnalysisUsageError", "SparkUnavailableError", "analyze"]
