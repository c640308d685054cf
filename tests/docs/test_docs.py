"""The documentation covers what the code defines, and its links resolve.

Every list checked here is taken from the code (the spec's catalogues, the parameter
schemas, the built-in functions, the datasets' records, the command line), so a new
operator, parameter, connector, dataset, built-in or option fails this test until it
is documented. No processes: reading files and importing modules only.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from agiledart.app.builtins import BUILTINS
from agiledart.app.schema import (
    CHECKPOINT_PARAMS,
    DATASET_PARAMS,
    OPERATOR_PARAMS,
    SCALING_PARAMS,
    SINK_PARAMS,
    SOURCE_PARAMS,
)
from agiledart.app.spec import (
    AGGREGATES,
    CHECKPOINT_MODES,
    DEAD_LETTER_CONNECTORS,
    DEAD_LETTER_FIELDS,
    DEAD_LETTER_PATH,
    ON_ERROR_POLICIES,
    OPERATOR_KINDS,
    PLACEMENTS,
    SINK_CONNECTORS,
    SOURCE_CONNECTORS,
)
from agiledart.cli.entry import build_parser
from agiledart.datasets import DATASETS, generate

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
#: Peer commands' shared options, documented once in cli.md.
COMMON_OPTIONS = {"--via", "--timeout", "--cluster-key-file", "--insecure"}


def _text(name: str) -> str:
    return (DOCS / name).read_text(encoding="utf-8")


def _prose(text: str) -> str:
    """``text`` without its fenced code blocks."""
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


def _section(text: str, heading: str) -> str:
    """The body under the heading line ``heading`` (up to the next heading of its level
    or above); fails when there is no such heading."""
    level = len(heading) - len(heading.lstrip("#"))
    lines = text.splitlines()
    try:
        start = lines.index(heading)
    except ValueError:
        pytest.fail(f"no heading {heading!r}")
    end = len(lines)
    for i in range(start + 1, len(lines)):
        m = re.match(r"^(#+) ", lines[i])
        if m and len(m.group(1)) <= level:
            end = i
            break
    return "\n".join(lines[start + 1 : end])


def _missing(names: object, text: str) -> list[str]:
    return [str(n) for n in names if f"`{n}`" not in text]  # type: ignore[attr-defined]


def test_every_operator_kind_has_a_section_with_every_parameter() -> None:
    apps = _text("apps.md")
    for kind in OPERATOR_KINDS:
        body = _section(apps, f"### {kind}")
        assert not _missing([p.name for p in OPERATOR_PARAMS.get(kind, ())], body), kind
    assert not _missing(AGGREGATES, apps)


def test_the_specs_blocks_are_documented() -> None:
    apps = _text("apps.md")
    checkpoint = _section(apps, "## Checkpoints: `checkpoint:`")
    assert not _missing([p.name for p in CHECKPOINT_PARAMS], checkpoint)
    assert not _missing(CHECKPOINT_MODES, checkpoint)
    scaling = _section(apps, "## Elastic scaling: `scaling:`")
    assert not _missing([p.name for p in SCALING_PARAMS], scaling)
    assert not _missing(PLACEMENTS, apps)
    assert not _missing(PLACEMENTS, _text("placement.md"))


def test_every_on_error_policy_and_every_field_of_a_dead_letter_are_documented() -> None:
    body = _section(_text("apps.md"), "### Records that raise: `on_error`")
    assert not _missing(ON_ERROR_POLICIES, body)
    assert not _missing(DEAD_LETTER_CONNECTORS, body)
    assert not _missing(DEAD_LETTER_FIELDS, body)
    assert f"`{DEAD_LETTER_PATH}`" in body
    assert f"`{DEAD_LETTER_PATH}`" in _section(_text("connectors.md"), "## Dead-letter sinks")


def test_every_builtin_function_and_its_parameters_are_documented() -> None:
    apps = _section(_text("apps.md"), "## User functions")
    for name, builtin in BUILTINS.items():
        row = next((line for line in apps.splitlines() if line.startswith(f"| `{name}` |")), None)
        assert row is not None, f"builtin {name} is not in apps.md"
        assert f"| {builtin.kind} |" in row, name
        assert not _missing(builtin.parameters, row), name


@pytest.mark.parametrize(
    ("kind", "connectors", "schemas"),
    [("source", SOURCE_CONNECTORS, SOURCE_PARAMS), ("sink", SINK_CONNECTORS, SINK_PARAMS)],
)
def test_every_connector_has_a_section_with_every_parameter(
    kind: str, connectors: tuple[str, ...], schemas: dict[str, tuple[object, ...]]
) -> None:
    text = _text("connectors.md")
    for name in connectors:
        body = _section(text, f"## {name} {kind}")
        assert not _missing([p.name for p in schemas[name]], body), (kind, name)  # type: ignore[attr-defined]


def test_every_dataset_has_a_section_with_its_fields_and_parameters() -> None:
    text = _text("datasets.md")
    assert set(DATASETS) == set(DATASET_PARAMS)
    for name in DATASETS:
        body = _section(text, f"## {name}")
        fields = set()
        for record in generate(name, rate=1000, count=200, seed=1):
            fields |= set(record)
        assert not _missing(sorted(fields), body), name
        assert not _missing([p.name for p in DATASET_PARAMS[name]], text), name
    generator = _section(_text("connectors.md"), "## generator source")
    assert not _missing(DATASETS, generator)


def _commands() -> Iterator[tuple[str, argparse.ArgumentParser]]:
    parser = build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            yield from action.choices.items()


def test_every_command_and_option_is_in_cli_md() -> None:
    text = _text("cli.md")
    common = _section(text, "## Options of every command that asks a peer")
    names = []
    for name, parser in _commands():
        names.append(name)
        body = _section(text, f"## {name}")
        asks_a_peer = "--via" in parser._option_string_actions
        for action in parser._actions:
            for option in action.option_strings:
                if option in ("-h", "--help"):
                    continue
                where = common if asks_a_peer and option in COMMON_OPTIONS else body
                assert f"`{option}" in where, f"agiledart {name} {option} is not in cli.md"
            if not action.option_strings:
                assert f"`{action.metavar or action.dest}`" in body, (name, action.dest)
    assert len(names) >= 13


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to '-'."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in _prose(path.read_text(encoding="utf-8")).splitlines():
        m = re.match(r"^#{1,6} (.*)$", line)
        if not m:
            continue
        slug = _slug(m.group(1))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def _links(path: Path) -> Iterator[str]:
    text = _prose(path.read_text(encoding="utf-8"))
    text = re.sub(r"`[^`\n]*`", "", text)  # inline code is not a link
    for m in re.finditer(r"\]\(([^)\s]+)\)", text):
        yield m.group(1)


DOC_FILES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


@pytest.mark.parametrize("path", DOC_FILES, ids=lambda p: p.name)
def test_every_relative_link_resolves(path: Path) -> None:
    broken = []
    for target in _links(path):
        if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            broken.append(f"{target}: no such file")
            continue
        if not dest.is_relative_to(ROOT):
            broken.append(f"{target}: outside the repository")
        elif anchor and (dest.suffix != ".md" or anchor not in _anchors(dest)):
            broken.append(f"{target}: no heading #{anchor}")
    assert not broken, f"{path.name}: " + "; ".join(broken)


def test_the_link_checker_finds_a_broken_anchor_and_file(tmp_path: Path) -> None:
    page = tmp_path / "a.md"
    page.write_text("# Title: `x` and y\n[ok](#title-x-and-y) [bad](#nope) [gone](b.md)\n")
    assert list(_links(page)) == ["#title-x-and-y", "#nope", "b.md"]
    assert _anchors(page) == {"title-x-and-y"}


#: Files outside the repository that docs and code once cited (built in pieces so this
#: file does not match itself).
_OUTSIDE = re.compile("|".join([r"\bDESIGN\b", r"\.\./" + "shared", r"\bpapers/"]))
_SKIP_DIRS = {".git", ".venv", "build", "dist", "node_modules", "__pycache__"}
_TEXT_SUFFIXES = {".py", ".md", ".toml", ".yaml", ".yml", ".sh", ".txt", ".cfg", ".html", ".js"}


def _repo_text_files() -> Iterator[Path]:
    for path in ROOT.rglob("*"):
        rel = path.relative_to(ROOT)
        if any(part in _SKIP_DIRS or part.startswith(".") for part in rel.parts[:-1]):
            continue
        if not path.is_file() or rel.parts[0].endswith(".egg-info"):
            continue
        if path.suffix in _TEXT_SUFFIXES or path.name in ("Makefile", "Dockerfile"):
            yield path


def test_no_file_cites_a_document_outside_the_repository() -> None:
    # CHANGELOG.md is history: it may name what was there when it was written.
    offenders = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in _repo_text_files()
        if path.name != "CHANGELOG.md"
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
        if _OUTSIDE.search(line)
    ]
    assert not offenders, "\n".join(offenders)


def test_the_readme_starts_with_the_two_commands_and_stays_short() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200
    first_block = _section("\n".join(lines), lines[0]).split("```")[1]
    assert "make emulate" in first_block
    assert "make test" in first_block
