#!/usr/bin/env bash
# Session 14, H200 call 2: DFlash attention variants (bench/dflash_attention.py), then
# trackside's step with the BlockMask from context ranges and the Triton loss pass,
# profiled; the DFlash GPU tests.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
OUT=$OUT timeout 150 python3 bench/dflash_attention.py 2>&1 | tee $OUT/attention.log
OUT=$OUT timeout 130 python3 bench/dflash_step.py --trainers trackside --steps 5 --warmup 1 \
  --profile 45 --timeout 120 2>&1 | tee $OUT/dflash.log
timeout 150 python3 -m pytest -m gpu -p no:cacheprovider -o addopts= -q \
  tests/training/test_dflash.py > $OUT/gpu-tests-dflash.log 2>&1
tail -5 $OUT/gpu-tests-dflash.log
