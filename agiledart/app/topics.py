"""MQTT topic names, topic filters and topic templates: checks and wildcard matching.

Plain functions over strings, shared by the spec checks and the MQTT connectors.

Theory of operation (MQTT 3.1.1 §4.7, the same in 5.0): a topic is a string of levels
separated by ``/``. A *filter* may use ``+`` for exactly one whole level and ``#`` for
any number of trailing levels (including none: ``a/#`` matches ``a``); a *topic name*,
what a message is published to, never holds either. Filters whose first level is a
wildcard do not match topics that start with ``$`` (the broker's ``$SYS/...``).
A *template* is a topic name with ``{field}`` placeholders filled from a record; a
filled value that brings a wildcard or a NUL in is an error for that record only.
"""

from __future__ import annotations

import math
import string
from collections.abc import Mapping
from typing import Any

__all__ = [
    "MAX_TOPIC_BYTES",
    "TopicTemplate",
    "filter_problem",
    "template_problem",
    "topic_matches",
    "topic_problem",
]

#: A topic is a UTF-8 string of at most 65535 bytes (its length is a 16-bit field).
MAX_TOPIC_BYTES = 65535


def _size_problem(text: str) -> str | None:
    if not text:
        return "it is empty"
    if "\0" in text:
        return "it holds a NUL character"
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        return "it is not valid UTF-8"
    if size > MAX_TOPIC_BYTES:
        return f"it is {size} bytes long; the limit is {MAX_TOPIC_BYTES}"
    return None


def topic_problem(topic: str) -> str | None:
    """None if ``topic`` can be published to, else what is wrong with it."""
    bad = _size_problem(topic)
    if bad is None and ("+" in topic or "#" in topic):
        bad = "a topic to publish to cannot hold the wildcards + or #"
    return bad


def filter_problem(topic_filter: str) -> str | None:
    """None if ``topic_filter`` is a valid subscription filter, else what is wrong."""
    bad = _size_problem(topic_filter)
    if bad is not None:
        return bad
    levels = topic_filter.split("/")
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != len(levels) - 1):
            return "'#' must be a whole level, and the last one (sensors/#)"
        if "+" in level and level != "+":
            return "'+' must be a whole level (sensors/+/pollution)"
    return None


def topic_matches(topic_filter: str, topic: str) -> bool:
    """Whether a message published to ``topic`` matches ``topic_filter``."""
    if topic.startswith("$") and topic_filter[:1] in ("+", "#"):
        return False
    want = topic_filter.split("/")
    have = topic.split("/")
    for i, level in enumerate(want):
        if level == "#":
            return True
        if i >= len(have):
            return False
        if level != "+" and level != have[i]:
            return False
    return len(want) == len(have)


def _parts(template: str) -> list[tuple[str, str | None]]:
    """``(literal, field or None)`` pieces; ValueError naming what is malformed."""
    out: list[tuple[str, str | None]] = []
    for literal, field, spec, conversion in string.Formatter().parse(template):
        if field is None:
            out.append((literal, None))
            continue
        if not field or spec or conversion or not field.isidentifier():
            msg = f"{{{field}}} is not a placeholder: use a record field name, e.g. {{key}}"
            raise ValueError(msg)
        out.append((literal, field))
    return out


def template_problem(template: str) -> str | None:
    """None if ``template`` is a valid topic template, else what is wrong with it."""
    bad = _size_problem(template)
    if bad is not None:
        return bad
    try:
        parts = _parts(template)
    except ValueError as exc:
        return str(exc)
    if any("+" in lit or "#" in lit for lit, _ in parts):
        return "a topic to publish to cannot hold the wildcards + or #"
    return None


def _text(value: Any) -> str | None:
    """How a field value reads inside a topic; None for values that have no such form."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float) and math.isfinite(value):
        return repr(value)
    if value is None:
        return "null"
    return None


class TopicTemplate:
    """A checked topic template, e.g. ``out/{key}``; :meth:`fill` makes one topic."""

    __slots__ = ("_parts", "fields", "template")

    def __init__(self, template: str) -> None:
        bad = template_problem(template)
        if bad is not None:
            msg = f"bad topic template {template!r}: {bad}"
            raise ValueError(msg)
        self.template = template
        self._parts = _parts(template)
        self.fields = tuple(f for _, f in self._parts if f is not None)

    def fill(self, record: Mapping[str, Any]) -> str:
        """The topic for ``record``; ValueError naming the field when it cannot be made."""
        if not self.fields:
            return self.template
        out: list[str] = []
        for literal, field in self._parts:
            out.append(literal)
            if field is None:
                continue
            if field not in record:
                msg = f"the record has no field {field!r} for topic {self.template!r}"
                raise ValueError(msg)
            text = _text(record[field])
            if text is None:
                msg = f"field {field!r} ({type(record[field]).__name__}) cannot go in a topic"
                raise ValueError(msg)
            out.append(text)
        topic = "".join(out)
        bad = topic_problem(topic)
        if bad is not None:
            msg = f"topic {topic[:80]!r} from {self.template!r}: {bad}"
            raise ValueError(msg)
        return topic
