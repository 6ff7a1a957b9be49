#!/usr/bin/env bash
# Session 14, H200 call 1: profile trackside's DFlash step (Triton loss pass, and the eager
# pass beside it), the GPU-marked tests, the kimi-k2 65,536 x 5 peak on today's trainer.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,power.limit,driver_version --format=csv > $OUT/gpu.txt
python3 -c "import torch; print(torch.__version__)" >> $OUT/gpu.txt
mkdir -p $OUT/prof
OUT=$OUT/prof timeout 280 python3 bench/dflash_step.py --trainers trackside --eager-loss \
  --steps 5 --warmup 1 --profile 45 --timeout 130 2>&1 | tee $OUT/dflash.log
( time timeout 200 python3 -m pytest -m gpu -p no:cacheprovider -o addopts= -q tests ) \
  > $OUT/gpu-tests.log 2>&1
tail -4 $OUT/gpu-tests.log
OUT=$OUT/prof timeout 100 python3 bench/train_step.py --cells kimi-k2:65536:5 \
  --trainers trackside+ckpt --repeats 1 --steps 2 --warmup 0 --timeout 95 2>&1 | tee $OUT/kimi.log
