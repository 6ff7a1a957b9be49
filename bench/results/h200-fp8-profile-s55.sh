#!/usr/bin/env bash
# Issue 45 items 2-4, written in session 54 for the next call (either card): why `--fp8`
# was slower than bf16 on the H200 in session 54 (h200-fp8-s53.sh ran it after
# speculators' child was killed at its timeout). In two parts, one call each, so that a
# machine taken back mid-call loses only one (session 56):
#   eagle3 (~300 s): fp8's GPU tests (session 57: the attention's projections in fp8
#     too); each matmul and cast of the fp8 MLP alone beside bf16 at both
#     drafters' sizes (bench/fp8_matmul.py); then the fp8 EAGLE-3 step first and alone on
#     the card, then bf16, each profiled over 40 steps;
#   matmul (~60 s): only the first half of eagle3, for a call with little device time;
#   dflash (~280 s): DFlash's step the same, then its fresh box, whose compiled set comes
#     back tarred (compiled-dflash.tgz) to ship in the package.
# Each part's files come back as one tarball (the device returns few files). From the
# tree's root: bash bench/results/h200-fp8-profile-s55.sh eagle3|matmul|dflash
set -uo pipefail
part=${1:?eagle3, matmul or dflash}
source bench/device_wheels.sh || exit 1
mkdir -p /tmp/o && nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee /tmp/o/card.txt
if [ "$part" = eagle3 ]; then  # fp8's GPU tests: the MLP, and EAGLE-3 with every projection in fp8
  timeout 120 python3 -m pytest -m gpu -p no:cacheprovider -o addopts= -q tests/training/test_fp8.py \
    2>&1 | tail -15 | tee /tmp/o/fp8-gpu-tests.log
fi
if [ "$part" != dflash ]; then
  for cell in "eagle3 llama3-8b" "dflash qwen3-8b"; do set -- $cell
    mkdir -p /tmp/o/fp8-$1 && OUT=/tmp/o/fp8-$1 timeout 90 python3 bench/fp8_matmul.py --drafter $1 --preset $2 2>&1 | tee /tmp/o/fp8-$1/fp8_matmul.log
  done
fi
if [ "$part" = eagle3 ]; then
  OUT=/tmp/o timeout 200 python3 bench/train_step.py --cells llama3-8b:8192:5 --repeats 1 \
    --trainers trackside+frozen+fp8 trackside+frozen --profile 40 --timeout 120 2>&1 | tee /tmp/o/eagle3.log | tail -8
elif [ "$part" = dflash ]; then
  for mode in fp8 bf16; do
    flag=(); [ $mode = fp8 ] && flag=(--fp8)
    OUT=/tmp/o timeout 100 python3 bench/dflash_step.py --trainers trackside --steps 8 --warmup 2 --timeout 90 \
      --profile 40 "${flag[@]}" 2>&1 | tee /tmp/o/dflash-$mode.log | tail -3
  done
  echo "steps done at ${SECONDS} s"
  OUT=/tmp/o timeout $((300 - SECONDS)) python3 bench/fresh_box.py --drafters dflash 2>&1 | tail -30
fi
tar -C /tmp/o -czf $OUT/s55-$part.tgz . && ls -la $OUT
