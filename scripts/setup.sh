#!/usr/bin/env bash
# Idempotent set-up of .venv: torch's CPU pin first (a bare torch requirement would pull
# several GB of CUDA wheels), then the project with every extra.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
stamp=.venv/.trackside-setup
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q torch==2.13.0
  .venv/bin/python -m pip install -q -e '.[train,dev]'
  touch "$stamp"
fi
