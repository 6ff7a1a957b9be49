#!/usr/bin/env bash
# Issue 45 items 2-3, session 57 (either card, ~340 s): --fp8 with every projection of the
# layers in fp8 and the compiled casts' sizes constants (training/compiled.py), against
# bf16 and speculators 0.9.0 in one call: EAGLE-3 llama3-8b 8192 x TTT 5 (head frozen),
# all three children profiled; then DFlash Qwen3-8B 8192 (tokens made in the step,
# speculators' work) in fp8 and bf16, profiled. One tarball back. From the tree's root.
set -uo pipefail
source bench/device_wheels.sh || exit 1
mkdir -p /tmp/o && nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee /tmp/o/card.txt
OUT=/tmp/o timeout 420 python3 bench/train_step.py --cells llama3-8b:8192:5 --repeats 1 \
  --trainers trackside+frozen+fp8 trackside+frozen speculators --profile 40 --timeout 240 \
  2>&1 | tee /tmp/o/eagle3.log | tail -12
echo "EAGLE-3 done at ${SECONDS} s"
for mode in fp8 bf16; do
  flag=(); [ $mode = fp8 ] && flag=(--fp8)
  mkdir -p /tmp/o/dflash-$mode && OUT=/tmp/o/dflash-$mode timeout 100 python3 bench/dflash_step.py --trainers trackside --tokens-in-step --steps 8 \
    --warmup 2 --timeout 90 --profile 40 "${flag[@]}" 2>&1 | tee /tmp/o/dflash-$mode/dflash.log | tail -3
done
echo "done at ${SECONDS} s"
tar -C /tmp/o -czf $OUT/s57.tgz . && ls -la $OUT
