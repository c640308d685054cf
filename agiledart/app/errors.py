"""Errors of the application layer: specs, functions, operators, datasets, execution.

::

    AgiledartError                      (agiledart.errors)
    └── AppError
        ├── SpecError          an invalid app spec or --set binding (local misuse);
        │                      ``problems`` lists every (field path, message) found
        ├── FunctionError      a ``fn`` reference that cannot be resolved (local misuse)
        ├── OperatorError      an operator driven wrongly: bad input index, bad
        │                      parameters given directly to a constructor (local misuse)
        ├── SnapshotError      resume-state bytes that cannot be restored
        ├── DatasetError       an unknown dataset or bad generator arguments (local misuse)
        ├── ExecutionError     the local executor cannot run this app (e.g. an mqtt
        │                      connector, an unreadable file)
        └── DataError          bad data from outside (remote misbehaviour); counted and
            │                  skipped by readers and operators, never fatal
            └── ParseError     one bad input line of a file, with its line number

The CLI catches only :class:`~agiledart.errors.AgiledartError`.
"""

from __future__ import annotations

from dataclasses import dataclass

from agiledart.errors import AgiledartError

__all__ = [
    "AppError",
    "DataError",
    "DatasetError",
    "ExecutionError",
    "FunctionError",
    "OperatorError",
    "ParseError",
    "Problem",
    "SnapshotError",
    "SpecError",
]


class AppError(AgiledartError):
    """Base class of the application layer's errors."""


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with a spec: where (``operators[2].params.size_ms``) and what."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class SpecError(AppError):
    """An app spec is invalid. Carries every problem found, not just the first."""

    def __init__(self, problems: list[Problem] | tuple[Problem, ...], *, name: str = "") -> None:
        self.problems: tuple[Problem, ...] = tuple(problems)
        self.name = name
        what = f"app spec {name!r}" if name else "app spec"
        n = len(self.problems)
        lines = [f"{what} is invalid ({n} problem{'s' if n != 1 else ''}):"]
        lines += [f"  {p}" for p in self.problems]
        super().__init__("\n".join(lines))

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(p.path for p in self.problems)


class FunctionError(AppError):
    """A function reference (``fn``) cannot be resolved to a callable."""


class OperatorError(AppError):
    """An operator was driven or configured wrongly by the code calling it."""


class SnapshotError(AppError):
    """Resume-state bytes cannot be restored into this operator."""


class DatasetError(AppError):
    """An unknown dataset or bad generator arguments."""


class ExecutionError(AppError):
    """The local executor cannot run this app."""


class DataError(AppError):
    """Bad data from outside: skipped and counted by whoever meets it."""


class ParseError(DataError):
    """One input line that could not be turned into a record."""

    def __init__(self, line: int, reason: str) -> None:
        self.line = line
        self.reason = reason
        super().__init__(f"line {line}: {reason}")
