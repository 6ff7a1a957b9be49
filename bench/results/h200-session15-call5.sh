#!/usr/bin/env bash
# Session 15, H200 call 5: trackside's DFlash step at the Qwen3-8B shape again, alone, in a
# fresh machine: a second sample of call 1's figure, for its spread between runs.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout 140 python3 bench/dflash_step.py --trainers trackside --steps 8 --warmup 2 \
  --timeout 130 2>&1 | tee $OUT/repeat.log
