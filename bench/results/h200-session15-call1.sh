#!/usr/bin/env bash
# Session 15, H200 call 1: trackside's DFlash step against speculators 0.9.0's in one run
# (Qwen3-8B shape, block 16, 512 anchors, CE), trackside also making the verifier's tokens
# in the step, and trackside's first step at a new shape; every child profiled.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader
timeout 560 python3 bench/dflash_step.py --trainers trackside speculators --tokens-in-step \
  --new-shape --steps 8 --warmup 2 --profile 40 --timeout 340 2>&1 | tee $OUT/compare.log
