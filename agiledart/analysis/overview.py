"""The report's first two sections: what was read, and what was skipped as malformed."""

from __future__ import annotations

from agiledart.analysis.model import Section, Table
from agiledart.analysis.reader import REASONS, Traces
from agiledart.analysis.schemas import RECORD_TYPES

__all__ = ["malformed_section", "overview_section"]

_MEANING = {
    "not_json": "not a JSON object (truncated line, garbage)",
    "unknown_type": "no type, or a type the schema does not define",
    "unsupported_version": "a schema version other than 1",
    "bad_fields": "a field of the wrong type, or a required field missing",
}


def overview_section(traces: Traces) -> Section:
    section = Section("overview", "Overview", ())
    span = (
        (traces.t1_ms - traces.t0_ms) / 1000.0
        if traces.t0_ms is not None and traces.t1_ms is not None
        else 0.0
    )
    valid = sum(traces.counts.values())
    section.notes.append(
        f"{len(traces.files)} files, {traces.lines} lines: {valid} valid records, "
        f"{traces.malformed.total} malformed; {span:.1f} s of trace."
    )
    kinds = [*RECORD_TYPES, *sorted(set(traces.counts) - set(RECORD_TYPES))]
    section.tables += [
        Table(
            "record_counts",
            "Valid records per type",
            ["type", "records"],
            [(k, traces.counts.get(k, 0)) for k in kinds],
        ),
        Table(
            "files",
            "Trace files",
            ["file", "bytes", "malformed"],
            [
                (
                    name,
                    path.stat().st_size,
                    sum(n for f, _, n in traces.malformed.by_file if f == name),
                )
                for path in traces.files
                for name in [str(path.relative_to(traces.directory))]
            ],
        ),
    ]
    return section


def malformed_section(traces: Traces) -> Section:
    section = Section("malformed", "Malformed lines", ())
    bad = traces.malformed
    section.notes.append(
        f"{bad.total} of {traces.lines} lines did not fit the schema; they were skipped."
    )
    section.tables.append(
        Table(
            "malformed",
            "Malformed lines per reason",
            ["reason", "lines", "meaning"],
            [(r, bad.counts.get(r, 0), _MEANING[r]) for r in REASONS],
        )
    )
    if bad.total:
        section.tables += [
            Table(
                "malformed_files",
                "Malformed lines per file",
                ["file", "reason", "lines"],
                [tuple(x) for x in bad.by_file],
            ),
            Table(
                "malformed_examples",
                "Examples",
                ["file", "reason", "line"],
                [tuple(x) for x in bad.examples],
            ),
        ]
    return section
