"""Traces: what peers record for the offline analysis (docs/traces.md).

:mod:`agiledart.traces.schema` defines the records, :mod:`agiledart.traces.writer`
writes them. ``agiledart analyze`` (:mod:`agiledart.analysis`) reads them with Spark.
"""

from agiledart.traces.schema import SCHEMA_VERSION, TraceSchemaError, check
from agiledart.traces.writer import NullTraceWriter, TraceWriter, trace_files

__all__ = [
    "SCHEMA_VERSION",
    "NullTraceWriter",
    "TraceSchemaError",
    "TraceWriter",
    "check",
    "trace_files",
]
