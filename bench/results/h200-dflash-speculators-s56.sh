#!/usr/bin/env bash
# Issue 45 item 3, written in session 55 for a later call (either card, ~560 s): DFlash
# Qwen3-8B 8192, block 16, 512 anchors, against speculators 0.9.0 in one call on the H200
# (its only measure so far was an H100's, session 49), trackside making the verifier's
# tokens in the step (speculators' work), each child profiled. trackside's child first: in
# session 49 speculators' cold first step took 239 s and the call's limit cut what followed.
# Everything comes back as one tarball (the device returns few files). From the tree's root.
set -uo pipefail
source bench/device_wheels.sh || exit 1
mkdir -p /tmp/o && nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee /tmp/o/card.txt
python3 -c 'import torch, speculators; print(torch.__version__, speculators.__version__)' | tee -a /tmp/o/card.txt
OUT=/tmp/o timeout 560 python3 bench/dflash_step.py --trainers trackside speculators --tokens-in-step \
  --steps 8 --warmup 2 --profile 40 --timeout 420 2>&1 | tee /tmp/o/dflash.log | tail -12
echo "done at ${SECONDS} s"
tar -C /tmp/o -czf $OUT/s56-dflash.tgz . && ls -la $OUT
