#!/usr/bin/env bash
# Issue 45 items 2-4 on the H200, written in session 58 (whose one machine was an H100, its
# device time spent on DFlash: h200-fp8-s58.sh dflash) for the next: three parts, one
# call each (a machine taken back loses one).
#   eagle3 (~530 s): fp8's GPU tests (every weight cast in one call; a frozen head's
#     gradient in fp8: neither has run on a GPU in full yet) and DFlash's step queued with
#     no read from the device, as EAGLE-3's (session 59), then EAGLE-3 llama3-8b
#     8192 x TTT 5 (head frozen): --fp8, bf16 and speculators 0.9.0 in one call, each
#     profiled, trackside's with where the CPU and the GPU are at each TTT step (--timeline);
#   dflash (~520 s): DFlash Qwen3-8B 8192, the verifier's tokens made in the step
#     (speculators' work): trackside --fp8 first, then speculators (its cold first step
#     took 307 s on an H100 in session 58), each profiled, trackside's with where the CPU
#     and the GPU are at each layer (--timeline);
#   freshbox (~300 s): DFlash's fresh box, its compiled set back as compiled-dflash.tgz,
#     to commit under training/compiled/<target>/ and name in package-data.
# Each part writes into $OUT as it goes: a call cut at its limit still brings back what ran.
# From the tree's root: bash bench/results/h200-fp8-s59.sh PART
set -uo pipefail
part=${1:?eagle3, dflash or freshbox}
source bench/device_wheels.sh || exit 1
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $OUT/card.txt
case $part in
eagle3)
  timeout 180 python3 -m pytest -m gpu -p no:cacheprovider -o addopts= -v tests/training/test_fp8.py \
    tests/training/test_dflash.py::test_a_dflash_step_queues_its_forward_and_backward_without_reading_the_device \
    tests/training/test_model.py::test_an_eagle3_step_queues_its_forward_and_backward_without_reading_the_device \
    > $OUT/fp8-gpu-tests.log 2>&1; tail -8 $OUT/fp8-gpu-tests.log
  timeout 380 python3 bench/train_step.py --cells llama3-8b:8192:5 --repeats 1 \
    --trainers trackside+frozen+fp8 trackside+frozen speculators --profile 40 --timeline --timeout 240 \
    2>&1 | tee $OUT/eagle3.log | tail -12 ;;
dflash)
  # speculators' child took 395 s of its 400 in session 58 (set-up 77 s, first step 307)
  timeout 570 python3 bench/dflash_step.py --trainers trackside speculators --tokens-in-step \
    --fp8 --steps 8 --warmup 2 --timeout 450 --profile 40 --timeline 2>&1 | tee $OUT/dflash.log \
    | tail -40 ;;
freshbox)
  timeout 300 python3 bench/fresh_box.py --drafters dflash 2>&1 | tail -30 ;;
esac
echo "done at ${SECONDS} s"
ls -la $OUT
