"""The operator kinds: one table, and every set of kinds derived from it.

Each row says what the rest of the system needs to know about a kind without building
one: whether it applies a user function, whether it takes several inputs (a rendezvous
of JOIN routing, paper §IV-B), whether it holds state that checkpoints carry
(``snapshot()`` / ``restore()``, paper §IV-D), and whether that state is a set of
per-key entries, so that a keyed operator's records and state can be split by key over
replicas (paper §IV-C). The operators themselves are built in
:mod:`agiledart.operators.factory`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

__all__ = [
    "FN_OPERATORS",
    "KEYED_OPERATORS",
    "KINDS",
    "MERGE_OPERATORS",
    "OPERATOR_KINDS",
    "STATEFUL_OPERATORS",
    "STATELESS_OPERATORS",
    "OperatorKind",
]


@dataclass(frozen=True)
class OperatorKind:
    """What one operator kind is, as placement, checkpoints and scaling see it."""

    name: str
    fn: bool = False  #: applies a user function (``fn``); ``key_by`` may instead name a key
    merge: bool = False  #: takes several inputs
    stateful: bool = False  #: its state is checkpointed
    keyed: bool = False  #: its state (stateful only) is per key, split by key over replicas


#: Every operator kind an app spec may name, in the order the docs list them.
KINDS: Mapping[str, OperatorKind] = MappingProxyType(
    {
        k.name: k
        for k in (
            OperatorKind("map", fn=True),
            OperatorKind("filter", fn=True),
            OperatorKind("flat_map", fn=True),
            OperatorKind("key_by"),
            OperatorKind("window", stateful=True, keyed=True),
            OperatorKind("join", merge=True, stateful=True, keyed=True),
            OperatorKind("union", merge=True),
            OperatorKind("top_k", stateful=True),
            OperatorKind("dedupe", stateful=True, keyed=True),
            OperatorKind("aggregate", stateful=True, keyed=True),
        )
    }
)
OPERATOR_KINDS = tuple(KINDS)
#: Operators that apply a user function (``fn``), always.
FN_OPERATORS = frozenset(k.name for k in KINDS.values() if k.fn)
#: Operators that take more than one input (the rendezvous points of JOIN routing).
MERGE_OPERATORS = frozenset(k.name for k in KINDS.values() if k.merge)
#: Operators whose state must be checkpointed.
STATEFUL_OPERATORS = frozenset(k.name for k in KINDS.values() if k.stateful)
#: Operators without state: any replica may take any record.
STATELESS_OPERATORS = frozenset(k.name for k in KINDS.values() if not k.stateful)
#: Stateful operators whose state is a set of per-key entries (split by key).
KEYED_OPERATORS = frozenset(k.name for k in KINDS.values() if k.keyed)
