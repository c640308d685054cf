"""``agiledart analyze``: the command line of the analysis (pyspark imported lazily)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from agiledart.analysis.errors import AnalysisUsageError

__all__ = ["add_parser"]


def _setting(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        msg = f"expected KEY=VALUE, got {text!r}"
        raise argparse.ArgumentTypeError(msg)
    return key.strip(), value


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "analyze",
        help="analyze peer traces with Spark (needs the analysis extra)",
        description="Read the traces under TRACE_DIR (<peer>/trace-NNNNNN.ndjson[.gz], "
        "docs/traces.md) with PySpark and write CSV tables, PNG plots and report.html "
        "to --out: latency percentiles, throughput, regret and path choices, placement, "
        "scaling and recovery timelines. Malformed lines are counted and skipped.",
    )
    p.add_argument("trace_dir", type=Path, metavar="TRACE_DIR", help="a --trace-dir of peers")
    p.add_argument("--out", required=True, type=Path, metavar="DIR", help="where to write")
    p.add_argument(
        "--master",
        metavar="URL",
        help="Spark master (default local[2]: Spark in this process, two cores)",
    )
    p.add_argument(
        "--window",
        type=float,
        default=1.0,
        metavar="S",
        help="seconds per window of the latency and throughput timelines (default 1)",
    )
    p.add_argument(
        "--conf",
        type=_setting,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting, e.g. spark.driver.memory=4g (repeatable)",
    )
    p.set_defaults(func=_cmd_analyze)


def _cmd_analyze(args: argparse.Namespace) -> int:
    from agiledart.analysis.run import analyze

    if not args.trace_dir.is_dir():
        msg = f"{args.trace_dir} is not a directory"
        raise AnalysisUsageError(msg)
    result = analyze(
        args.trace_dir, args.out, window_s=args.window, master=args.master, conf=dict(args.conf)
    )
    if result.malformed_total:
        detail = ", ".join(f"{k}: {v}" for k, v in result.malformed.items() if v)
        print(
            f"warning: skipped {result.malformed_total} malformed lines ({detail})",
            file=sys.stderr,
        )
    valid = sum(result.records.values())
    print(
        f"analyzed {result.lines} lines ({valid} records) in {result.seconds:.1f} s; "
        f"report: {result.report}"
    )
    return 0
