"""Writing an analysis out: ``tables/*.csv``, ``plots/*.png``, ``summary.json`` and one
``report.html`` that refers to them by relative paths, so the folder reads offline.

The HTML has no external resources. A small inline script marks ``<body>`` with
``data-images`` (the number of images), ``data-images-broken`` (those that did not
load) and ``data-images-ok`` (``yes``/``no``) once the page has loaded, so a headless
browser can check that every plot is there.
"""

from __future__ import annotations

import csv
import html
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from agiledart.analysis.model import Plot, Section, Table

__all__ = ["PREVIEW_ROWS", "write_report"]

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


def write_csv(table: Table, path: Path) -> None:
    with path.open("w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(table.columns)
        out.writerows([_cell(v) for v in row] for row in table.rows)


def draw(plot: Plot, path: Path) -> None:
    fig = Figure(figsize=plot.size, dpi=100)
    FigureCanvasAgg(fig)  # the Agg backend, without pyplot's global state
    plot.draw(fig)
    fig.savefig(path, format="png", bbox_inches="tight")


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
    out: Path, title: str, sections: Sequence[Section], summary: dict[str, Any]
) -> Path:
    """Write every table and plot of ``sections`` under ``out``, then ``report.html``."""
    (out / "tables").mkdir(parents=True, exist_ok=True)
    (out / "plots").mkdir(parents=True, exist_ok=True)
    for section in sections:
        for table in section.tables:
            write_csv(table, out / "tables" / f"{table.name}.csv")
        for plot in section.plots:
            draw(plot, out / "plots" / f"{plot.name}.png")
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
