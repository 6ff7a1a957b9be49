#!/usr/bin/env bash
# The whole test suite from a fresh clone: set-up, the OpenSSH server the integration
# tests start on 127.0.0.1, the browser the serve test drives, then pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
apt_updated=
apt_install() {  # as root; one `apt-get update` however many packages are missing
  [ -n "$apt_updated" ] || { apt-get update -qq >/dev/null && apt_updated=1; }
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}
if ! command -v sshd >/dev/null && [ ! -x /usr/sbin/sshd ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "installing openssh-server for the SSH integration tests…" >&2
    apt_install openssh-server
  else
    echo "sshd is missing and we are not root: the SSH tests will be skipped" >&2
  fi
fi
# Headless Chromium for `trackside serve`'s browser test (tests/tui/test_serve.py); about
# 45 s to install, update included.
if ! command -v chromium >/dev/null; then
  if [ "$(id -u)" = 0 ]; then
    echo "installing chromium for the browser test of trackside serve…" >&2
    apt_install --no-install-recommends chromium \
      || echo "could not install chromium: the browser test of trackside serve will be skipped" >&2
  else
    echo "chromium is missing and we are not root: the browser test of trackside serve will be skipped" >&2
  fi
fi
command -v tmux >/dev/null || { echo "tmux is required for the tests" >&2; exit 1; }
.venv/bin/lint-imports
# Three workers on CI's two cores: many tests wait on tmux, sshd and child processes rather
# than the CPU (docs/testing.md has the timings), and the dashboard's tests then meet the
# load a busy machine gives them. The slowest start first, one to a worker (`--dist
# worksteal`, tests/conftest.py's order): none is left to start last on a lone worker. Here,
# not in pyproject's addopts: an install without pytest-xdist (scripts/test_no_extras.sh)
# runs pytest too.
# The 25 slowest tests at the end: where a CI run's minutes went.
exec .venv/bin/python -m pytest -n "${TRACKSIDE_TEST_WORKERS:-3}" --dist worksteal --durations=25 "$@"
