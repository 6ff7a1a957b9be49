#!/usr/bin/env bash
# Issue 45 item 4, session 53: a fresh box's first step with and without the compiled
# artifacts shipped in the package (training/compile_cache.py), both drafters, then the
# GPU test of the trainer keeping and loading them. Run from the tree's root.
set -uo pipefail
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,power.limit --format=csv,noheader | tee $OUT/card.txt
env | grep -E '^PYTHON|^TORCH|^TRITON' | tee $OUT/env.txt
PYTHONPATH=$PWD python3 bench/fresh_box.py 2>&1 | tail -120
PYTHONPATH=$PWD timeout 200 python3 -m pytest -m gpu -p no:cacheprovider -o addopts= -q -x tests/training/test_compile_cache.py 2>&1 | tail -5 | tee $OUT/gpu-test.log
ls -laR $OUT | head -40
