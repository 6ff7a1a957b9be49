#!/usr/bin/env bash
# Issue 45 item 1 on the H200, session 49 call 1: kimi-k2 131,072 × TTT 5, every step
# recomputed, head frozen, --offload-saved under a 96 GiB cap for 32 steps (the last try
# was cut at 15), `fit`'s prediction beside it; then, in what is left of the call, what is
# on the device at the peak of an offloaded step (bench/peak_owners.py, 49,152 tokens).
# Asked for nvidia-h200 without needs_h200, it ran on an H100 (79 GiB): step 1 out of
# memory (h200-offload-s49-h100-oom.log); peak_owners.py failed with a SystemError from the
# allocator's history recorder in the recompute and was not kept.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
fit=(--preset kimi-k2 --gpu-mem-gib 96 --ttt-steps 5 --checkpoint-ttt --freeze-lm-head --max-seq-len 131072)
python3 -m training fit "${fit[@]}" 2>&1 | head -3 | tee $OUT/fit-131072.txt
python3 -m training fit "${fit[@]}" --offload-saved 2>&1 | head -4 | tee -a $OUT/fit-131072.txt
python3 bench/random_data.py --preset kimi-k2 --out $PWD/.kimi-data --samples 60 --length 2048
echo "data ready at ${SECONDS} s"; free -g | head -2
flags="--data $PWD/.kimi-data --preset kimi-k2 --ttt-steps 5 --checkpoint-ttt --freeze-lm-head --gpu-mem-gib 96 --save-every 0 --device cuda --offload-saved"
/usr/bin/time -v timeout -s KILL 445 python3 -m training train $flags --max-seq-len 131072 \
  --steps 32 --out /tmp/r131o > $OUT/train-131072-offload.log 2>&1
echo "rc=$? at ${SECONDS} s"; grep -v "^step=" $OUT/train-131072-offload.log | grep -v '^\s' | tail -8
grep "^step=" $OUT/train-131072-offload.log; grep 'Maximum resident' $OUT/train-131072-offload.log
cp /tmp/r131o/metrics.jsonl $OUT/metrics-131072-offload.jsonl; free -g | head -2
left=$((575 - SECONDS)); echo "peak owners with ${left} s left"
[ "$left" -gt 40 ] && timeout -s KILL $left python3 bench/peak_owners.py --top 40 --max-entries 1500000 -- \
  $flags --max-seq-len 49152 --steps 2 --out /tmp/r49o 2>&1 | grep -v '^step=' | tail -50 | tee $OUT/peak-owners-49152.txt
