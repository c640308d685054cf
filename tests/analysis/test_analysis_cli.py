"""``agiledart analyze`` on the command line: usage errors, and the message when the
analysis extra is missing (without starting Spark)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from agiledart.cli.entry import main

BLOCK_PYSPARK = (
    "import sys; sys.modules['pyspark'] = None; "
    "from agiledart.cli.entry import main; sys.exit(main(sys.argv[1:]))"
)


def test_help_lists_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["analyze", "--help"])
    out = capsys.readouterr().out
    for flag in ("TRACE_DIR", "--out", "--master", "--window", "--conf"):
        assert flag in out


def test_without_pyspark_it_says_what_to_install(tmp_path: Path) -> None:
    (tmp_path / "p1").mkdir()
    (tmp_path / "p1" / "trace-000001.ndjson").write_text("{}\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            BLOCK_PYSPARK,
            "analyze",
            str(tmp_path),
            "--out",
            str(tmp_path / "o"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert "Error: pyspark is not installed; install the analysis extra" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_missing_directory_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["analyze", str(tmp_path / "nowhere"), "--out", str(tmp_path / "o")]) == 1
    assert "is not a directory" in capsys.readouterr().err


def test_a_directory_without_traces_is_an_error(
    spark: object, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "p1").mkdir()
    (tmp_path / "p1" / "notes.txt").write_text("hello\n")
    assert main(["analyze", str(tmp_path), "--out", str(tmp_path / "o")]) == 1
    assert "no trace files" in capsys.readouterr().err


def test_an_unreadable_trace_file_is_named_and_nothing_is_left_behind(
    spark: object, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    traces = tmp_path / "traces"
    good = traces / "p1" / "trace-000001.ndjson"
    good.parent.mkdir(parents=True)
    good.write_text('{"v":1,"type":"meta","ts":1.0,"peer":"p1","schema":1,"version":"x"}\n')
    (traces / "p2" / "trace-000001.ndjson").mkdir(parents=True)  # not a file
    out = tmp_path / "o"
    assert main(["analyze", str(traces), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "cannot read 1 trace file(s): p2/trace-000001.ndjson: IsADirectoryError" in err
    assert not (out / ".records").exists()


@pytest.mark.parametrize("window", ["0", "-1", "nan"])
def test_a_bad_window_is_an_error(
    window: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["analyze", str(tmp_path), "--out", str(tmp_path / "o"), "--window", window]) == 1
    assert "window must be a positive number" in capsys.readouterr().err
