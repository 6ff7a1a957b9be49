#!/usr/bin/env bash
# Issue 45 item 1 on the H200: kimi-k2 × TTT 5, every step recomputed, head frozen, under
# a 96 GiB cap, with --offload-saved (training/offload.py): its cost at 92,160 (which fits
# without it: 6.1 s a step, 86.61 GiB in call 1) and 131,072 (fit: 113.4 GiB without) over
# 30 steps.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
python3 -m training fit --preset kimi-k2 --gpu-mem-gib 96 --ttt-steps 5 --checkpoint-ttt \
  --freeze-lm-head --max-seq-len 131072 2>&1 | head -3 | tee $OUT/fit-131072.txt
python3 bench/random_data.py --preset kimi-k2 --out /tmp/kimi --samples 96 --length 2048
flags="--data /tmp/kimi --preset kimi-k2 --ttt-steps 5 --checkpoint-ttt --freeze-lm-head --gpu-mem-gib 96 --save-every 0 --device cuda --offload-saved"
echo "== 92160 offload"
timeout 150 python3 -m training train $flags --max-seq-len 92160 --steps 4 --out /tmp/r92o 2>&1 | tail -8 | tee $OUT/train-92160-offload.log
cp /tmp/r92o/metrics.jsonl $OUT/metrics-92160-offload.jsonl
echo "== 131072 offload"
timeout 390 python3 -m training train $flags --max-seq-len 131072 --steps 30 --out /tmp/r131o 2>&1 | tail -40 | tee $OUT/train-131072-offload.log
cp /tmp/r131o/metrics.jsonl $OUT/metrics-131072-offload.jsonl
nvidia-smi --query-gpu=memory.used --format=csv,noheader
