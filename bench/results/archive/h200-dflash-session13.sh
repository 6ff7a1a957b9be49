#!/usr/bin/env bash
# The one H200 call of session 13 (issue 22): every DFlash measurement, logs under $OUT.
# Run from the repository root with the wheels of .whl/ (speculators 0.9.0 and what it
# imports that the machine lacks) installed to /tmp/site first.
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,power.limit,driver_version --format=csv \
  > $OUT/gpu.txt 2>&1
python3 -c "import torch, transformers, speculators; print(torch.__version__, \
transformers.__version__, speculators.__version__)" >> $OUT/gpu.txt 2>&1

# 1. trackside against speculators at the Qwen3-8B shape, then trackside at a new shape
mkdir -p $OUT/compare
OUT=$OUT/compare timeout 230 python3 bench/dflash_step.py --new-shape --steps 5 \
  --warmup 1 --timeout 150 2>&1 | tee $OUT/compare.log

# 2. the story's configuration capped at 95 GiB, chunked and unchunked; beside it, a
#    synthetic DFlash run exported and loaded by speculators (a tiny drafter: its
#    allocations are its own process's, so the story's peaks are untouched)
( timeout 90 python3 -m training train --synthetic --drafter dflash --device cuda \
    --steps 20 --out /tmp/dfrun --export /tmp/dfexport > $OUT/export.log 2>&1 &&
  timeout 65 python3 bench/dflash_step.py --export-check /tmp/dfexport \
    --data /tmp/dfrun/data >> $OUT/export.log 2>&1 ) &
mkdir -p $OUT/story
OUT=$OUT/story timeout 160 python3 bench/dflash_step.py --story --gpu-mem-gib 95 \
  --steps 2 --warmup 1 --timeout 100 2>&1 | tee $OUT/story.log
wait
cp /tmp/dfexport/config.json $OUT/export-config.json 2>/dev/null
tail -3 $OUT/export.log
