#!/usr/bin/env bash
# Issue 45 item 1, session 49 call 4 (an H100: 131,072 needs an H200, which did not come):
# `fit`'s new model against kimi-k2 65,536 × TTT 5, every step recomputed, head frozen,
# with --offload-saved (and without, if time is left), 3 steps under a 76 GiB cap; fit's predictions
# printed first, from the same tree. Ran on an H100 in 146 s; the no-offload half was
# skipped (started only before 110 s).
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
fit=(--preset kimi-k2 --gpu-mem-gib 76 --ttt-steps 5 --checkpoint-ttt --freeze-lm-head --max-seq-len 65536)
python3 -m training fit "${fit[@]}" --offload-saved 2>&1 | head -3 | tee $OUT/fit-65536.txt
python3 -m training fit "${fit[@]}" 2>&1 | head -1 | tee -a $OUT/fit-65536.txt
python3 bench/random_data.py --preset kimi-k2 --out /tmp/kimi --samples 32 --length 2048
echo "data ready at ${SECONDS} s"
flags="--data /tmp/kimi --preset kimi-k2 --ttt-steps 5 --checkpoint-ttt --freeze-lm-head --gpu-mem-gib 76 --save-every 0 --device cuda --max-seq-len 65536 --steps 3"
timeout 150 python3 -m training train $flags --offload-saved --out /tmp/r65o > $OUT/train-65536-offload.log 2>&1
echo "offload rc=$? at ${SECONDS} s"; grep '^step=\|out of memory' $OUT/train-65536-offload.log
cp /tmp/r65o/metrics.jsonl $OUT/metrics-65536-offload.jsonl
[ $SECONDS -lt 110 ] || exit 0
timeout $((225 - SECONDS)) python3 -m training train $flags --out /tmp/r65 > $OUT/train-65536.log 2>&1
echo "plain rc=$? at ${SECONDS} s"; grep '^step=\|out of memory' $OUT/train-65536.log
cp /tmp/r65/metrics.jsonl $OUT/metrics-65536.jsonl
