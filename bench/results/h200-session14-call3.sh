#!/usr/bin/env bash
# Session 14, H200 call 3: the GPU-marked tests (scripts/gpu_check.sh tests), trackside's
# DFlash step at the Qwen3-8B shape and a new shape (profiled), the story's configuration
# capped at 95 GiB (chunked; unchunked fused; unchunked eager, the story's softmaxes).
set -uo pipefail
( time bash scripts/gpu_check.sh tests ) > $OUT/gpu-check.log 2>&1
tail -3 $OUT/gpu-tests.log
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT/step $OUT/story
OUT=$OUT/step timeout 150 python3 bench/dflash_step.py --trainers trackside --new-shape \
  --steps 5 --warmup 1 --profile 45 --timeout 100 2>&1 | tee $OUT/step.log
OUT=$OUT/story timeout 200 python3 bench/dflash_step.py --story --gpu-mem-gib 95 \
  --steps 2 --warmup 1 --timeout 90 2>&1 | tee $OUT/story.log
