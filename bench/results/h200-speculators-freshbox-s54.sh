#!/usr/bin/env bash
# Issue 45 items 2 and 4, session 54, on the H200 warm from h200-fp8-s53.sh (whose
# speculators child hit its 120 s timeout): EAGLE-3 llama3-8b 8192 × TTT 5 against
# speculators 0.9.0 with a longer child timeout, then a fresh box's first step
# (bench/fresh_box.py). Outputs go back as one tarball (the device returns few files).
set -uo pipefail
tui=(); for w in ../.whl-tui/*.whl; do [ -e "../.whl/${w##*/}" ] || tui+=("$w"); done
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site ../.whl/*.whl "${tui[@]}" || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p /tmp/o && nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee /tmp/o/card.txt
timeout 260 python3 bench/train_step.py --cells llama3-8b:8192:5 --repeats 1 \
  --trainers speculators trackside+frozen --timeout 200 2>&1 | tee /tmp/o/eagle3.log | tail -8
mv $OUT/train_step.json /tmp/o/ 2>/dev/null
echo "eagle3 done at ${SECONDS} s"
timeout $((560 - SECONDS)) python3 bench/fresh_box.py 2>&1 | tee /tmp/o/fresh_box.log | tail -40
mv $OUT/compiled /tmp/o/ 2>/dev/null
tar -C /tmp/o -czf $OUT/s54.tgz . && ls -la $OUT
