#!/usr/bin/env bash
# Issue 45 items 2-4 on the H200, written in session 57 (whose three calls found only an
# H100) for the next: in three parts, one call each (a machine taken back loses one).
#   eagle3 (~330 s): fp8's GPU tests (the MLP; both drafters, every projection in fp8),
#     then EAGLE-3 llama3-8b 8192 x TTT 5 (head frozen): --fp8, bf16 and speculators 0.9.0
#     in one call, each profiled;
#   dflash (~520 s): fp8's GPU tests (session 58: every weight cast in one call, the loss's
#     gradient through DFlash's head in fp8), then DFlash Qwen3-8B 8192, the verifier's
#     tokens made in the step (speculators' work): trackside --fp8 first, then speculators
#     (its cold first step took 239 s on an H100), each profiled;
#   freshbox (~300 s): DFlash's fresh box, its compiled set back as compiled-dflash.tgz,
#     to commit under training/compiled/<target>/ and name in package-data.
# One tarball back per part. From the tree's root: bash bench/results/h200-fp8-s58.sh PART
set -uo pipefail
part=${1:?eagle3, dflash or freshbox}
source bench/device_wheels.sh || exit 1
mkdir -p /tmp/o && nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee /tmp/o/card.txt
case $part in
eagle3)
  timeout 150 python3 -m pytest -m gpu -p no:cacheprovider -o addopts= -q tests/training/test_fp8.py \
    2>&1 | tail -15 | tee /tmp/o/fp8-gpu-tests.log
  OUT=/tmp/o timeout 420 python3 bench/train_step.py --cells llama3-8b:8192:5 --repeats 1 \
    --trainers trackside+frozen+fp8 trackside+frozen speculators --profile 40 --timeout 240 \
    2>&1 | tee /tmp/o/eagle3.log | tail -12 ;;
dflash)
  # trackside --fp8 (as extracted, then with the tokens made in the step) and speculators in
  # one run of the bench, trackside first. DFlash's bf16 step is left out for the call's
  # time (session 57's cold fp8 child alone ran past 100 s for its two passes).
  timeout 100 python3 -m pytest -m gpu -p no:cacheprovider -o addopts= -q tests/training/test_fp8.py \
    2>&1 | tail -15 | tee /tmp/o/fp8-gpu-tests.log
  OUT=/tmp/o timeout 470 python3 bench/dflash_step.py --trainers trackside speculators --tokens-in-step \
    --fp8 --steps 8 --warmup 2 --timeout 420 --profile 40 2>&1 | tee /tmp/o/dflash.log | tail -6 ;;
freshbox)
  OUT=/tmp/o timeout 300 python3 bench/fresh_box.py --drafters dflash 2>&1 | tail -30 ;;
esac
echo "done at ${SECONDS} s"
tar -C /tmp/o -czf $OUT/s58-$part.tgz . && ls -la $OUT
