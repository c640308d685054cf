"""Writing an analysis out: ``tables/*.csv``, ``plots/*.png``, ``summary.json`` and one
``report.html`` that refers to them by relative paths, so the folder reads offline.

A section is rendered (:func:`render`: CSV text and PNG bytes, in memory) as soon as
its Spark jobs are done, while the other sections' jobs still run, and written with
the page at the end (:func:`write_report`), so a failed analysis leaves an earlier
report as it was. The HTML has no external resources. A small inline script marks ``<body>`` with
``data-images`` (the number of images), ``data-images-broken`` (those that did not
load) and ``data-images-ok`` (``yes``/``no``) once the page has loaded, so a headless
browser can check that every plot is there.
"""

from __future__ import annotations

import csv
import html
import io
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from agiledart.analysis.model import Plot, Section, Table

__all__ = ["PREVIEW_ROWS", "Rendered", "render", "write_report"]

PREVIEW_ROWS = 15

_STYLE = """
body { font-family: sans-serif; margin: 2em auto; max-width: 70em; color: #222; }
h1 { border-bottom: 2px solid #888; } h2 { border-bottom: 1px solid #ccc; margin-top: 2em; }
table { border-collapse: collapse; margin: 0.5em 0 1em; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.5em; text-align: right; }
th { background: #eee; } td.text { text-align: left; }
figure { margin: 1em 0; } img { max-width: 100%; border: 1px solid #ddd; }
.empty { color: #777; font-style: italic; } .warn { color: #a40; }
"""

_CHECK = """
window.addEventListener("load", function () {
  var images = Array.prototype.slice.call(document.images);
  var broken = images.filter(function (i) { return !(i.complete && i.naturalWidth > 0); });
  document.body.setAttribute("data-images", String(images.length));
  document.body.setAttribute("data-images-broken", String(broken.length));
  document.body.setAttribute("data-images-ok", broken.length === 0 ? "yes" : "no");
});
"""


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return "" if math.isnan(value) else repr(value)
    return str(value)


def csv_text(table: Table) -> str:
    text = io.StringIO(newline="")
    out = csv.writer(text)
    out.writerow(table.columns)
    if any(v != v for row in table.rows for v in row):
        out.writerows([_cell(v) for v in row] for row in table.rows)
    else:
        # what _cell does, but a NaN: the csv module writes None as "" and a float as
        # its repr (a log table of 200,000 rows: 0.5 CPU-s against 0.75)
        out.writerows(table.rows)
    return text.getvalue()


def png(plot: Plot) -> bytes:
    fig = Figure(figsize=plot.size, dpi=100)
    FigureCanvasAgg(fig)  # the Agg backend, without pyplot's global state
    plot.draw(fig)
    image = io.BytesIO()
    fig.savefig(image, format="png", bbox_inches="tight")
    return image.getvalue()


@dataclass(frozen=True)
class Rendered:
    """A section's files before they are written: CSV text per table, PNG per plot."""

    tables: dict[str, str]
    plots: dict[str, bytes]


def render(section: Section) -> Rendered:
    return Rendered(
        tables={t.name: csv_text(t) for t in section.tables},
        plots={p.name: png(p) for p in section.plots},
    )


def _html_value(value: Any) -> tuple[str, bool]:
    if isinstance(value, float):
        return (f"{value:.4g}" if math.isfinite(value) else str(value)), True
    if isinstance(value, int | bool) or value is None:
        return _cell(value), True
    return html.escape(str(value)), False


def html_table(columns: Sequence[str], rows: Sequence[Sequence[Any]], limit: int) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = []
    for row in rows[:limit]:
        cells = []
        for value in row:
            text, numeric = _html_value(value)
            cells.append(f"<td>{text}</td>" if numeric else f'<td class="text">{text}</td>')
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def _section_html(section: Section) -> str:
    parts = [f'<h2 id="{section.key}">{html.escape(section.title)}</h2>']
    kinds = ", ".join(f"<code>{k}</code>" for k in section.record_types)
    if section.empty:
        parts.append(f'<p class="empty">no records of this type ({kinds})</p>')
        return "\n".join(parts)
    if kinds:
        parts.append(f"<p>From {kinds} records.</p>")
    parts += [f"<p>{html.escape(n)}</p>" for n in section.notes]
    for plot in section.plots:
        parts.append(
            f'<figure><img src="plots/{plot.name}.png" alt="{html.escape(plot.caption)}">'
            f"<figcaption>{html.escape(plot.caption)}</figcaption></figure>"
        )
    for table in section.tables:
        more = len(table.rows) - PREVIEW_ROWS
        note = f" (first {PREVIEW_ROWS} of {len(table.rows)} rows)" if more > 0 else ""
        parts.append(
            f'<h3>{html.escape(table.title)}{note}: <a href="tables/{table.name}.csv">'
            f"{table.name}.csv</a></h3>"
        )
        parts.append(
            html_table(table.columns, table.rows, PREVIEW_ROWS)
            if table.rows
            else '<p class="empty">no rows</p>'
        )
    return "\n".join(parts)


def write_report(
    out: Path,
    title: str,
    sections: Sequence[Section],
    summary: dict[str, Any],
    rendered: Sequence[Rendered],
) -> Path:
    """Write the tables and plots :func:`render` made of ``sections`` (``rendered``, one
    per section) under ``out``, then ``report.html``."""
    (out / "tables").mkdir(parents=True, exist_ok=True)
    (out / "plots").mkdir(parents=True, exist_ok=True)
    for files in rendered:
        for name, text in files.tables.items():
            (out / "tables" / f"{name}.csv").write_text(text, newline="")
        for name, image in files.plots.items():
            (out / "plots" / f"{name}.png").write_bytes(image)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    toc = "".join(
        f'<li><a href="#{s.key}">{html.escape(s.title)}</a>'
        f"{' (no records)' if s.empty else ''}</li>"
        for s in sections
    )
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>{_STYLE}</style></head>
<body>
<h1>{html.escape(title)}</h1>
<ul>{toc}</ul>
{"".join(_section_html(s) for s in sections)}
<script>{_CHECK}</script>
</body></html>
"""
    report = out / "report.html"
    report.write_text(page)
    return report
