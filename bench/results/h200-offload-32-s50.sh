#!/usr/bin/env bash
# Issue 45 item 1 on the H200, session 50 call 1: kimi-k2 131,072 × TTT 5, every step
# recomputed, head frozen, --offload-saved under a 96 GiB cap for 32 steps, `fit`'s
# prediction beside it, and nvidia-smi's view of the card (memory.used: what the allocator
# reserved plus the CUDA context) every 500 ms through the run.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/card.txt
fit=(--preset kimi-k2 --gpu-mem-gib 96 --ttt-steps 5 --checkpoint-ttt --freeze-lm-head --max-seq-len 131072)
python3 -m training fit "${fit[@]}" 2>&1 | head -3 | tee $OUT/fit-131072.txt
python3 -m training fit "${fit[@]}" --offload-saved 2>&1 | head -4 | tee -a $OUT/fit-131072.txt
python3 bench/random_data.py --preset kimi-k2 --out $PWD/.kimi-data --samples 60 --length 2048
echo "data ready at ${SECONDS} s"; free -g | head -2
nvidia-smi --query-gpu=timestamp,memory.used,power.draw --format=csv,noheader,nounits -lms 500 > $OUT/smi-during-run.csv &
smi=$!
flags="--data $PWD/.kimi-data --preset kimi-k2 --ttt-steps 5 --checkpoint-ttt --freeze-lm-head --gpu-mem-gib 96 --save-every 0 --device cuda --offload-saved"
/usr/bin/time -v timeout -s KILL 540 python3 -m training train $flags --max-seq-len 131072 \
  --steps 32 --out /tmp/r131o > $OUT/train-131072-offload.log 2>&1
echo "rc=$? at ${SECONDS} s"; kill $smi
grep -v "^step=" $OUT/train-131072-offload.log | grep -v '^\s' | tail -8
grep "^step=" $OUT/train-131072-offload.log; grep 'Maximum resident' $OUT/train-131072-offload.log
cp /tmp/r131o/metrics.jsonl $OUT/metrics-131072-offload.jsonl; free -g | head -2
sort -t, -k2 -n $OUT/smi-during-run.csv | tail -1 | sed 's/^/card memory.used at its highest (MiB): /'
