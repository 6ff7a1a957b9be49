#!/usr/bin/env bash
# Set up (once) and open the dashboard on this machine with a small CPU training run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/trackside demo "$@"
