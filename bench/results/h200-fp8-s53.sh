#!/usr/bin/env bash
# Issue 45 items 2-4, session 53: train --fp8 (the MLP's matmuls in fp8) on the card: its
# GPU tests; EAGLE-3 llama3-8b 8192 × TTT 5, head frozen, against speculators 0.9.0 with
# and without it (bench/train_step.py); the loss of 40 steps with and without it on the
# same data; DFlash Qwen3-8B 8192 with and without it (trackside alone); then a fresh
# box's first step (bench/fresh_box.py) with what time is left. Run from the tree's root.
set -uo pipefail
# .whl-tui: the tests' conftest imports the dashboard; a wheel both folders hold goes once
tui=(); for w in ../.whl-tui/*.whl; do [ -e "../.whl/${w##*/}" ] || tui+=("$w"); done
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site ../.whl/*.whl "${tui[@]}" || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee $OUT/card.txt
timeout 100 python3 -m pytest -m gpu -p no:cacheprovider -o addopts= -q -x tests/training/test_fp8.py 2>&1 | tail -4 | tee $OUT/fp8-gpu-tests.log
timeout 230 python3 bench/train_step.py --cells llama3-8b:8192:5 --repeats 1 \
  --trainers speculators trackside+frozen trackside+frozen+fp8 --timeout 120 2>&1 | tee $OUT/eagle3.log | tail -25
echo "eagle3 done at ${SECONDS} s"
python3 bench/random_data.py --preset llama3-8b --out /tmp/parity-data --samples 40 --length 2048 > /dev/null
for mode in bf16 fp8; do
  flag=(); [ $mode = fp8 ] && flag=(--fp8)
  timeout 90 python3 -m training train --data /tmp/parity-data --preset llama3-8b --max-seq-len 8192 --ttt-steps 5 \
    --freeze-lm-head --steps 40 --save-every 0 --device cuda --out /tmp/parity-$mode "${flag[@]}" > $OUT/parity-$mode.log 2>&1
  cp /tmp/parity-$mode/metrics.jsonl $OUT/parity-$mode-metrics.jsonl
  grep -E '^step=(1|10|20|30|40) ' $OUT/parity-$mode.log
done
echo "parity done at ${SECONDS} s"
for mode in bf16 fp8; do
  flag=(); [ $mode = fp8 ] && flag=(--fp8)
  timeout 120 python3 bench/dflash_step.py --trainers trackside --tokens-in-step --steps 8 --warmup 2 --timeout 110 "${flag[@]}" 2>&1 | tee $OUT/dflash-$mode.log | tail -6
done
echo "dflash done at ${SECONDS} s"
timeout $((470 - SECONDS)) python3 bench/fresh_box.py 2>&1 | tail -80
ls $OUT
