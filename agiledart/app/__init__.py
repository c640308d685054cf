"""The application model: app specs, their validation and parameter binding.

An app is a value: :func:`parse_spec` (YAML text or a mapping), :func:`load_spec`
(a file) and the :class:`App` builder all produce the same validated, frozen
:class:`AppSpec`, or raise one :class:`SpecError` listing every problem with its field
path. :mod:`agiledart.app.graph` answers placement's questions (topological order,
source-to-sink chains, merge points).

The model imports nothing of :mod:`agiledart.operators` (which builds on it):
execution lives in :mod:`agiledart.local` (:func:`~agiledart.local.executor.run_local`,
the single-process executor, and :mod:`agiledart.local.reference`, plain-Python
expected outputs).

Errors (see :mod:`agiledart.app.errors` for the tree): :class:`AppError` and below.
"""

from agiledart.app.binding import apply_overrides, parse_override
from agiledart.app.builder import App, Stream
from agiledart.app.errors import (
    AppError,
    DataError,
    DatasetError,
    ExecutionError,
    FunctionError,
    OperatorError,
    ParseError,
    Problem,
    SnapshotError,
    SpecError,
)
from agiledart.app.functions import Resolver, bind, builtin_resolver, factory, parse_fn_ref
from agiledart.app.graph import chains, consumers, merge_points, topological_order
from agiledart.app.parse import load_spec, parse_spec
from agiledart.app.spec import (
    AppSpec,
    CheckpointSpec,
    OperatorSpec,
    SinkSpec,
    SourceSpec,
)

__all__ = [
    "App",
    "AppError",
    "AppSpec",
    "CheckpointSpec",
    "DataError",
    "DatasetError",
    "ExecutionError",
    "FunctionError",
    "OperatorError",
    "OperatorSpec",
    "ParseError",
    "Problem",
    "Resolver",
    "SinkSpec",
    "SnapshotError",
    "SourceSpec",
    "SpecError",
    "Stream",
    "apply_overrides",
    "bind",
    "builtin_resolver",
    "chains",
    "consumers",
    "factory",
    "load_spec",
    "merge_points",
    "parse_fn_ref",
    "parse_override",
    "parse_spec",
    "topological_order",
]
