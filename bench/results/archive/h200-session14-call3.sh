#!/usr/bin/env bash
# Session 14, H200 call 3: trackside's DFlash step at the Qwen3-8B shape and a new shape
# (profiled), then the story's configuration capped at 95 GiB (chunked; unchunked with the
# Triton pass; unchunked eager, the story's softmaxes).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT/step $OUT/story
OUT=$OUT/step timeout 150 python3 bench/dflash_step.py --trainers trackside --new-shape \
  --steps 5 --warmup 1 --profile 45 --timeout 100 2>&1 | tee $OUT/step.log
OUT=$OUT/story timeout 170 python3 bench/dflash_step.py --story --gpu-mem-gib 95 \
  --steps 2 --warmup 1 --timeout 90 2>&1 | tee $OUT/story.log
