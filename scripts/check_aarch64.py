"""Does every runtime dependency install on a 64-bit Raspberry Pi without a compiler?

For each entry of ``[project] dependencies`` in pyproject.toml (environment markers
evaluated for Linux), asks pip whether a binary wheel exists for CPython 3.11 on
aarch64 Linux (manylinux 2014 up to glibc 2.36, the glibc of Raspberry Pi OS bookworm)::

    pip download --only-binary=:all: --platform manylinux2014_aarch64 ... \
                 --python-version 3.11 --no-deps -d TMP 'pkg>=x'

and reports the wheel found, or that the package builds from source there (then
``apt install build-essential python3-dev`` first; ``scripts/setup.sh`` does). Needs
the package index (PyPI) to be reachable. Exit code 0 when the check ran, whatever it
found; 1 when pip could not be asked at all.

    python scripts/check_aarch64.py [--json] [--python-version 3.11]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: glibc of Raspberry Pi OS bookworm is 2.36: wheels for any manylinux up to it install
PLATFORMS = [
    "manylinux2014_aarch64",
    *(f"manylinux_2_{minor}_aarch64" for minor in (24, 26, 27, 28, 31, 34, 35, 36)),
    "linux_aarch64",
]


def runtime_dependencies() -> list[str]:
    """The requirement strings that apply on Linux (markers evaluated for it)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    out = []
    for req in project["dependencies"]:
        spec, _, marker = req.partition(";")
        marker = marker.strip()
        if marker and not _marker_holds_on_linux(marker):
            continue
        out.append(spec.strip())
    return out


def _marker_holds_on_linux(marker: str) -> bool:
    """The few markers pyproject uses: ``sys_platform ==/!= '...'``."""
    m = re.fullmatch(r"sys_platform\s*(==|!=)\s*['\"]([^'\"]+)['\"]", marker)
    if m is None:
        return True  # unknown marker: check the package anyway
    op, value = m.groups()
    return (value == "linux") == (op == "==")


def check(requirement: str, python_version: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="aarch64-") as tmp:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--disable-pip-version-check",
            "--quiet",
            "--no-deps",
            "--only-binary=:all:",
            *(a for p in PLATFORMS for a in ("--platform", p)),
            "--python-version",
            python_version,
            "--implementation",
            "cp",
            "-d",
            tmp,
            requirement,
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
        wheels = sorted(p.name for p in Path(tmp).glob("*.whl"))
    if proc.returncode == 0 and wheels:
        return {"requirement": requirement, "wheel": wheels[0], "source_build": False}
    reason = (proc.stderr.strip().splitlines() or ["pip found no wheel"])[-1]
    unreachable = "Could not fetch" in proc.stderr or "NewConnectionError" in proc.stderr
    return {
        "requirement": requirement,
        "wheel": None,
        "source_build": not unreachable,
        "error": reason if unreachable else None,
        "pip_says": reason,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object last")
    parser.add_argument("--python-version", default="3.11", help="CPython version (3.11)")
    args = parser.parse_args(argv)
    results = []
    for req in runtime_dependencies():
        r = check(req, args.python_version)
        results.append(r)
        what = r["wheel"] or ("SOURCE BUILD needed" if r["source_build"] else r["error"])
        print(f"{req:24} {what}", file=sys.stderr, flush=True)
    failed = [r for r in results if r.get("error")]
    builds = [r["requirement"] for r in results if r["source_build"]]
    report = {
        "python": args.python_version,
        "platforms": PLATFORMS,
        "results": results,
        "source_builds": builds,
        "unchecked": [r["requirement"] for r in failed],
    }
    if args.json:
        print(json.dumps(report))
    else:
        print(
            f"{len(results) - len(builds) - len(failed)} of {len(results)} runtime dependencies "
            f"have aarch64 wheels for CPython {args.python_version}; source builds: "
            f"{', '.join(builds) or 'none'}"
            + (f"; could not check: {', '.join(report['unchecked'])}" if failed else "")
        )
    return 1 if failed and len(failed) == len(results) else 0


if __name__ == "__main__":
    sys.exit(main())
