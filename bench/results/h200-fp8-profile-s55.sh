#!/usr/bin/env bash
# Issue 45 items 2-4, written in session 54 for the next call (either card, ~520 s): why
# `--fp8` was slower than bf16 on the H200 in session 54 (h200-fp8-s53.sh ran it after
# speculators' child was killed at its timeout). The fp8 EAGLE-3 step first and alone on
# the card, then bf16, each profiled over 40 steps; DFlash the same; then DFlash's fresh
# box, whose compiled set comes back tarred (compiled-dflash.tgz) to ship in the package.
# Everything comes back as one tarball (the device returns few files). From the tree's root.
set -uo pipefail
source bench/device_wheels.sh || exit 1
mkdir -p /tmp/o && nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee /tmp/o/card.txt
# Each matmul and cast of the fp8 MLP alone, bf16 beside it (session 56: bench/fp8_matmul.py).
for cell in "eagle3 llama3-8b" "dflash qwen3-8b"; do set -- $cell
  mkdir -p /tmp/o/fp8-$1 && OUT=/tmp/o/fp8-$1 timeout 90 python3 bench/fp8_matmul.py --drafter $1 --preset $2 2>&1 | tee /tmp/o/fp8-$1/fp8_matmul.log
done
OUT=/tmp/o timeout 200 python3 bench/train_step.py --cells llama3-8b:8192:5 --repeats 1 \
  --trainers trackside+frozen+fp8 trackside+frozen --profile 40 --timeout 120 2>&1 | tee /tmp/o/eagle3.log | tail -8
for mode in fp8 bf16; do
  flag=(); [ $mode = fp8 ] && flag=(--fp8)
  OUT=/tmp/o timeout 100 python3 bench/dflash_step.py --trainers trackside --steps 8 --warmup 2 --timeout 90 \
    --profile 40 "${flag[@]}" 2>&1 | tee /tmp/o/dflash-$mode.log | tail -3
done
echo "steps done at ${SECONDS} s"
OUT=/tmp/o timeout $((500 - SECONDS)) python3 bench/fresh_box.py --drafters dflash 2>&1 | tail -30
tar -C /tmp/o -czf $OUT/s55.tgz . && ls -la $OUT
