"""The command line loads only the module of the command it runs."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from agiledart.cli import entry as cli


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_every_command_is_registered_by_the_module_that_runs_it() -> None:
    full = _commands(cli.build_parser())
    own = {name for name, p in full.items() if p.get_default("func").__module__ == cli.__name__}
    assert own == {"peer", "ring", "route", "keygen"}
    for module, names in cli._ELSEWHERE.items():
        for name in names:
            assert full[name].get_default("func").__module__ == module, name
    assert set(full) == own | {n for names in cli._ELSEWHERE.values() for n in names}


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["status", "x"], "status"),
        (["--log-level", "debug", "emulate", "--peers", "3"], "emulate"),
        (["--log-level=debug", "ring"], "ring"),
        (["--help"], None),
        (["--log-level", "debug"], None),
        (["typo"], "typo"),
    ],
)
def test_the_command_is_found_before_parsing(argv: list[str], command: str | None) -> None:
    assert cli._command_of(argv) == command


def test_a_command_built_alone_parses_as_in_the_whole_parser() -> None:
    argv = ["submit", "app.yaml", "--via", "127.0.0.1:4000", "--insecure"]
    alone = vars(cli.build_parser(only="submit").parse_args(argv))
    whole = vars(cli.build_parser().parse_args(argv))
    assert alone.pop("func").__qualname__ == whole.pop("func").__qualname__
    assert alone == whole
    # every other command is still a valid choice, so a typo lists them all
    assert set(_commands(cli.build_parser(only="ring"))) == set(_commands(cli.build_parser()))


def test_a_query_does_not_load_the_runtime() -> None:
    probe = (
        "import json, sys\n"
        "from agiledart.cli.entry import main\n"
        "code = main(['ring', '--via', '127.0.0.1:1', '--insecure', '--timeout', '0.2'])\n"
        "print(json.dumps([code, sorted(m for m in sys.modules if m.startswith('agiledart'))]))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    code, modules = json.loads(proc.stdout.splitlines()[-1])
    assert code == 1  # nobody listens on port 1: a reported error
    assert "Error:" in proc.stderr
    for heavy in ("agiledart.peer", "agiledart.cli.emulate", "agiledart.runtime.scheduler"):
        assert heavy not in modules
