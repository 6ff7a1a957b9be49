#!/usr/bin/env bash
# Issue 45 item 4, session 54: DFlash's fresh box (bench/fresh_box.py --drafters dflash)
# on the warm H200, after h200-speculators-freshbox-s54.sh's DFlash launch found the disk
# full of the session's earlier runs (their checkpoints and data are removed first).
set -uo pipefail
rm -rf ~/.trackside/runs/2026* /tmp/parity-* /tmp/kimi-data /tmp/fresh-box-* /tmp/o; df -h /tmp | tail -1
tui=(); for w in ../.whl-tui/*.whl; do [ -e "../.whl/${w##*/}" ] || tui+=("$w"); done
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site ../.whl/*.whl "${tui[@]}" || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout 420 python3 bench/fresh_box.py --drafters dflash 2>&1 | tail -60
df -h /tmp | tail -1
