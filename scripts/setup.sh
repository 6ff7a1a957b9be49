#!/usr/bin/env bash
# Idempotent set-up of .venv: torch's CPU pin first (a bare torch requirement would pull
# several GB of CUDA wheels), then the project with every extra.
set -euo pipefail
cd "$(dirname "$0")/.."
pip_install() {
  # pip warns about absent local mirrors on some machines; keep the log readable.
  .venv/bin/python -m pip install -q --disable-pip-version-check "$@" 2>&1 \
    | { grep -vE '^WARNING: Location|BuildBackendWarning|^\s*$' || true; }
  return "${PIPESTATUS[0]}"
}
[ -x .venv/bin/python ] || python3 -m venv .venv
stamp=.venv/.trackside-setup
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "setting up .venv (first run takes a minute or two)…" >&2
  pip_install torch==2.13.0
  pip_install -e '.[train,dev]'
  touch "$stamp"
fi
