#!/usr/bin/env bash
# Issue 45 items 2-3, session 53, the short form of h200-fp8-s53.sh for the device time
# left: the fp8 GPU tests, then EAGLE-3 llama3-8b 8192 × TTT 5, head frozen, against
# speculators 0.9.0 with and without --fp8 in one call. Run from the tree's root.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site ../.whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $OUT/card.txt
timeout 90 python3 -m pytest -m gpu -p no:cacheprovider -o addopts= -q -x tests/training/test_fp8.py 2>&1 | tail -4 | tee $OUT/fp8-gpu-tests.log
timeout 240 python3 bench/train_step.py --cells llama3-8b:8192:5 --repeats 1 \
  --trainers speculators trackside+frozen trackside+frozen+fp8 --timeout 120 2>&1 | tee $OUT/eagle3.log | tail -25
echo "done at ${SECONDS} s"
