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

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Self

from agiledart.errors import AgiledartError, crosses_peers

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


#: the most problems one SpecError brings from another peer
MAX_PROBLEMS = 1000


@crosses_peers("AppError")
class AppError(AgiledartError):
    """Base class of the application layer's errors."""


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with a spec: where (``operators[2].params.size_ms``) and what."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


@crosses_peers("SpecError")
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

    @classmethod
    def wire_state(cls, error: AgiledartError) -> dict[str, Any]:
        assert isinstance(error, SpecError)
        problems = [[p.path, p.message] for p in error.problems]
        return {"name": error.name, "problems": problems}

    @classmethod
    def from_wire_state(cls, message: str, state: Mapping[str, Any]) -> Self:
        """Every problem the sender found, each still with its field path."""
        name, problems = state.get("name"), state.get("problems")
        if type(name) is not str or type(problems) is not list or len(problems) > MAX_PROBLEMS:
            msg = f"a SpecError's fields are a name and at most {MAX_PROBLEMS} problems"
            raise ValueError(msg)
        parsed = []
        for problem in problems:
            if not (
                type(problem) is list
                and len(problem) == 2
                and all(type(part) is str for part in problem)
            ):
                msg = "a SpecError problem is a [path, message] pair of strings"
                raise ValueError(msg)
            parsed.append(Problem(problem[0], problem[1]))
        return cls(parsed, name=name)


@crosses_peers("FunctionError")
class FunctionError(AppError):
    """A function reference (``fn``) cannot be resolved to a callable."""


@crosses_peers("OperatorError")
class OperatorError(AppError):
    """An operator was driven or configured wrongly by the code calling it."""


@crosses_peers("SnapshotError")
class SnapshotError(AppError):
    """Resume-state bytes cannot be restored into this operator."""


@crosses_peers("DatasetError")
class DatasetError(AppError):
    """An unknown dataset or bad generator arguments."""


@crosses_peers("ExecutionError")
class ExecutionError(AppError):
    """The local executor cannot run this app."""


@crosses_peers("DataError")
class DataError(AppError):
    """Bad data from outside: skipped and counted by whoever meets it."""


@crosses_peers("ParseError")
class ParseError(DataError):
    """One input line that could not be turned into a record."""

    wire_fields: ClassVar[Mapping[str, type]] = {"line": int, "reason": str}

    def __init__(self, line: int, reason: str) -> None:
        self.line = line
        self.reason = reason
        super().__init__(f"line {line}: {reason}")
