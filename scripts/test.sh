#!/usr/bin/env bash
# The whole test suite from a fresh clone: set-up, the OpenSSH server the integration
# tests start on 127.0.0.1, then pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if ! command -v sshd >/dev/null && [ ! -x /usr/sbin/sshd ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "installing openssh-server for the SSH integration tests…" >&2
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-server) >/dev/null
  else
    echo "sshd is missing and we are not root: the SSH tests will be skipped" >&2
  fi
fi
command -v tmux >/dev/null || { echo "tmux is required for the tests" >&2; exit 1; }
.venv/bin/lint-imports
# Two workers: most tests wait on tmux, sshd and child processes rather than the CPU, and
# the dashboard's tests then meet the load a busy machine gives them.
exec .venv/bin/python -m pytest -n "${TRACKSIDE_TEST_WORKERS:-2}" "$@"
