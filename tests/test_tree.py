"""The tree shows the architecture and stays small: checks over the source with ``ast``.

Each check is a pure function over a module's text (tested here on small made-up
modules, so that a check that never fires would be caught) and then run over the
library: ``agiledart/``, ``overlay/``, ``bandit/`` and ``recovery/``.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from agiledart.app.kinds import OPERATOR_KINDS

ROOT = Path(__file__).resolve().parents[1]
#: where each package of the library lives in the tree
PACKAGES = {
    "agiledart": "agiledart",
    "overlay": "agiledart.overlay",
    "bandit": "agiledart.bandit",
    "recovery": "agiledart.recovery",
}
MAX_MODULE_LINES = 700
MAX_CLASS_LINES = 400
#: Each algorithm (sans-IO: no sockets, timers or tasks), and its driver in the runtime,
#: under the same name (docs/architecture.md, "The repository").
PAIRS = {
    "agiledart/zones.py": "agiledart/runtime/zones.py",
    "agiledart/scaling": "agiledart/runtime/scaling.py",
    "bandit/relay.py": "agiledart/runtime/relay.py",
    "recovery": "agiledart/runtime/recovery.py",
}
#: what a sans-IO module never imports
IO_MODULES = ("asyncio", "socket", "subprocess", "selectors", "agiledart.runtime")


def _library() -> Iterator[tuple[str, str]]:
    for folder in PACKAGES:
        for path in sorted((ROOT / folder).rglob("*.py")):
            yield path.relative_to(ROOT).as_posix(), path.read_text(encoding="utf-8")


def _module_name(rel: str) -> str:
    folder, *rest = Path(rel).with_suffix("").parts
    name = ".".join([PACKAGES[folder], *rest])
    return name.removesuffix(".__init__")


# -- the checks, as pure functions --------------------------------------------------------


def long_classes(text: str, limit: int = MAX_CLASS_LINES) -> dict[str, int]:
    """The classes of a module longer than ``limit`` lines (nested ones too)."""
    return {
        node.name: n
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.ClassDef)
        and (n := (node.end_lineno or node.lineno) - node.lineno + 1) > limit
    }


def imports(text: str) -> set[str]:
    """The modules a module imports (absolute imports), outside ``if TYPE_CHECKING:``."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(text))
    return found


def unit(module: str) -> str:
    """The package (or top-level module) of the library a module belongs to:
    ``agiledart.runtime.mqtt.pool`` -> ``agiledart.runtime``."""
    return ".".join(module.split(".")[:2])


def cycles(edges: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            strong(v)
    return found


def kind_sets(text: str, kinds: tuple[str, ...] = OPERATOR_KINDS) -> list[int]:
    """Lines where a tuple, list or set of three or more operator kinds is written out."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.Tuple | ast.List | ast.Set)
        and len(node.elts) >= 3
        and all(isinstance(e, ast.Constant) and e.value in kinds for e in node.elts)
    ]


#: a document outside the repository: a design note, a paper digest, a paper's text file
OUTSIDE = re.compile(r"\bDESIGN\.md\b|\bDIGESTS\b|\b[\w-]+\.txt\s+§")


# -- the checks find what they look for ---------------------------------------------------


def test_the_class_check_finds_a_long_class() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_CLASS_LINES))
    assert long_classes(f"class Big:\n{body}\n") == {"Big": MAX_CLASS_LINES + 1}
    assert long_classes("class Small:\n    x = 1\n") == {}


def test_the_import_check_skips_type_checking_imports() -> None:
    text = (
        "from typing import TYPE_CHECKING\nimport agiledart.a\n"
        "if TYPE_CHECKING:\n    from agiledart.b import X\n"
        "def f():\n    from agiledart.c.d import Y\n"
    )
    assert imports(text) == {"typing", "agiledart.a", "agiledart.c.d"}


def test_the_cycle_check_finds_a_cycle_of_three() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(edges) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_kinds_check_finds_a_set_written_out() -> None:
    text = 'KEYED = ("window", "join", "dedupe")\nx = op in ("window", "aggregate")\n'
    assert kind_sets(text) == [1]


# -- the library ---------------------------------------------------------------------------


def test_no_module_is_over_700_lines() -> None:
    long = {rel: n for rel, text in _library() if (n := len(text.splitlines())) > MAX_MODULE_LINES}
    assert long == {}


def test_no_class_is_over_400_lines() -> None:
    long = {
        f"{rel}:{name}": n for rel, text in _library() for name, n in long_classes(text).items()
    }
    assert long == {}


def test_the_packages_import_each_other_without_a_cycle() -> None:
    edges: dict[str, set[str]] = {}
    for rel, text in _library():
        here = unit(_module_name(rel))
        for name in imports(text):
            if name.startswith("agiledart.") and unit(name) != here:
                edges.setdefault(here, set()).add(unit(name))
    assert cycles(edges) == []
    assert "agiledart.operators" not in edges.get("agiledart.app", set())


def test_the_operator_kinds_are_written_out_once() -> None:
    written = {
        rel: lines
        for rel, text in _library()
        if rel != "agiledart/app/kinds.py"
        if (lines := kind_sets(text))
    }
    assert written == {}


@pytest.mark.parametrize(("algorithm", "driver"), sorted(PAIRS.items()))
def test_each_algorithm_is_sans_io_beside_its_driver_of_the_same_name(
    algorithm: str, driver: str
) -> None:
    assert Path(algorithm).stem == Path(driver).stem
    assert (ROOT / driver).is_file()
    root = ROOT / algorithm
    paths = sorted(root.rglob("*.py")) if root.is_dir() else [root]
    assert paths
    for path in paths:
        found = imports(path.read_text(encoding="utf-8"))
        assert not {m for m in found if m.startswith(IO_MODULES)}, path


def test_no_module_cites_a_document_outside_the_repository() -> None:
    assert OUTSIDE.search("the RTR model (placement-rtr.txt §2)")
    cited = [
        f"{rel}:{n}"
        for rel, text in _library()
        for n, line in enumerate(text.splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert cited == []
