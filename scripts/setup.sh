#!/usr/bin/env bash
# Set up agiledart on a fresh Debian, Ubuntu or Raspberry Pi OS machine: the system
# packages it needs (a C compiler and Python headers: zfec builds from source where no
# wheel exists, e.g. on aarch64; the Mosquitto MQTT broker and its clients, which the
# MQTT tests run;
# Docker Engine, compose and debootstrap for the docker emulation and its tests),
# a virtualenv in .venv, and the package with its development tools. Safe to run
# again: it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "agiledart needs Python 3.11 or newer (set PYTHON=/path/to/python3.11)" >&2
    exit 1
fi

need=()
command -v gcc >/dev/null 2>&1 || need+=(build-essential)
"$PY" - <<'PYEOF' || need+=(python3-dev)
import os, sys, sysconfig
sys.exit(0 if os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")) else 1)
PYEOF
"$PY" -c 'import ensurepip, venv' >/dev/null 2>&1 || need+=(python3-venv)
command -v mosquitto >/dev/null 2>&1 || [ -x /usr/sbin/mosquitto ] || need+=(mosquitto)
# mosquitto_pub and mosquitto_sub: the MQTT burst tests and scripts/bench_connectors.py
command -v mosquitto_pub >/dev/null 2>&1 || need+=(mosquitto-clients)
# PostgreSQL: the sql sink's tests start a throwaway cluster (tests/support/postgres.py)
compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || need+=(postgresql)
# headless Chromium: the dashboard tests (tests/site) drive a real browser
command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || need+=(chromium)
# docker emulation (docker/, tests/docker): Docker Engine (the tests start dockerd when it
# is not running), compose (v2 plugin or Debian's docker-compose), debootstrap for the
# local base image (no registry needed)
command -v dockerd >/dev/null 2>&1 || [ -x /usr/sbin/dockerd ] || [ -x /usr/bin/dockerd ] || need+=(docker.io)
docker compose version >/dev/null 2>&1 || command -v docker-compose >/dev/null 2>&1 || need+=(docker-compose)
command -v debootstrap >/dev/null 2>&1 || [ -x /usr/sbin/debootstrap ] || need+=(debootstrap)
if ((${#need[@]})); then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "installing system packages: ${need[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
    else
        echo "please install: ${need[*]}  (sudo apt-get install ${need[*]})" >&2
        exit 1
    fi
fi

[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[dev,analysis]"
echo "agiledart is set up in .venv (activate with: . .venv/bin/activate)"
