"""Input data: deterministic generator datasets and file parsing.

:func:`generate` / :func:`generate_batches` make the ``urban``, ``taxi``, ``words`` and
``counter`` streams (see each module, and :mod:`agiledart.datasets.core` for how event
time follows ``rate``); :func:`read_file`, :func:`parse_jsonl` and :func:`parse_csv`
turn file lines into records, counting bad lines in a :class:`ParseStats`.
Errors: :class:`~agiledart.app.errors.DatasetError` (bad arguments) and
:class:`~agiledart.app.errors.ParseError` (a bad line; recorded, not raised).
"""

from agiledart.datasets.core import (
    CHUNK,
    DATASETS,
    chunk_size,
    generate,
    generate_batches,
    generator_kwargs,
)
from agiledart.datasets.files import MAX_LINE, ParseStats, parse_csv, parse_jsonl, read_file

__all__ = [
    "CHUNK",
    "DATASETS",
    "MAX_LINE",
    "ParseStats",
    "chunk_size",
    "generate",
    "generate_batches",
    "generator_kwargs",
    "parse_csv",
    "parse_jsonl",
    "read_file",
]
