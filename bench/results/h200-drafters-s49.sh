#!/usr/bin/env bash
# Issue 45 items 2-3, session 49 call 2: both drafters against speculators 0.9.0 in one
# call, every child profiled (two more steps after the timed ones): EAGLE-3 llama3-8b
# 8192 × TTT 5, head frozen (bench/train_step.py), then DFlash Qwen3-8B 8192, block 16,
# 512 anchors, trackside also making the verifier's tokens in the step (bench/dflash_step.py).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site ../.whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader
python3 -c 'import torch, speculators; print(torch.__version__, speculators.__version__)'
timeout 220 python3 bench/train_step.py --cells llama3-8b:8192:5 --repeats 1 \
  --trainers speculators trackside+frozen --profile 40 --timeout 200 2>&1 | tee $OUT/eagle3.log
echo "eagle3 done at ${SECONDS} s"
left=$((585 - SECONDS))
timeout $left python3 bench/dflash_step.py --trainers speculators trackside --tokens-in-step \
  --steps 8 --warmup 2 --profile 40 --timeout $((left - 10)) 2>&1 | tee $OUT/dflash.log
echo "dflash done at ${SECONDS} s"
