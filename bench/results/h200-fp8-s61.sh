#!/usr/bin/env bash
# Issue 45 items 2-3, written in session 60 after its H100 calls (h200-fp8-s59.sh's three
# parts: DFlash 1.39x at speculators' work, EAGLE-3 --fp8 1.38x with ~27 ms of CPU a step
# outside any op the profiler names). Two parts, one call each; each profile now names
# what the CPU was inside during the longest idle stretches (Python's frames traced).
#   eagle3 (~330 s): EAGLE-3 llama3-8b 8192 x TTT 5 (head frozen): --fp8, bf16 and
#     speculators 0.9.0, each profiled, trackside's with --timeline;
#   dflash (~520 s): DFlash Qwen3-8B 8192, the verifier's tokens made in the step:
#     trackside --fp8 (as extracted, then tokens in the step), then speculators.
# Each part writes into $OUT as it goes: a call cut at its limit still brings back what ran.
# From the tree's root: bash bench/results/h200-fp8-s61.sh PART
set -uo pipefail
part=${1:?eagle3 or dflash}
source bench/device_wheels.sh || exit 1
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $OUT/card.txt
case $part in
eagle3)
  timeout 400 python3 bench/train_step.py --cells llama3-8b:8192:5 --repeats 1 \
    --trainers trackside+frozen+fp8 trackside+frozen speculators --profile 40 --timeline --timeout 240 \
    2>&1 | tee $OUT/eagle3.log | tail -14 ;;
dflash)
  timeout 570 python3 bench/dflash_step.py --trainers trackside speculators --tokens-in-step \
    --fp8 --steps 8 --warmup 2 --timeout 450 --profile 40 --timeline 2>&1 | tee $OUT/dflash.log \
    | tail -40 ;;
esac
echo "done at ${SECONDS} s"
ls -la $OUT
