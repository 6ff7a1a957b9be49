#!/usr/bin/env bash
# Issue 45 item 0 on the H200: the fold's int32 offsets at kimi-k2 92,160 × TTT 5.
# 1. the GPU test of the fixed kernels (and the small fold test); 2. the same test on the
# kernels before the fix (.devtmp/fold_triton_before.py, HEAD's copy: expected to fail);
# 3. the reproduction with the fix; 4. if it is still NaN, the probe.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,power.limit,memory.total,driver_version --format=csv,noheader
t() { python3 -m pytest -p no:cacheprovider -o addopts= -m gpu -q -x "$@"; }
echo "== after the fix"; t tests/training/test_fold_offsets.py \
  "tests/training/test_model.py::test_triton_fold_matches_the_torch_fold_on_cuda" 2>&1 | tee $OUT/tests-after.log | tail -15
cp training/fold_triton.py /tmp/fixed.py; cp .devtmp/fold_triton_before.py training/fold_triton.py
echo "== before the fix"; t tests/training/test_fold_offsets.py 2>&1 | tee $OUT/tests-before.log | tail -25
cp /tmp/fixed.py training/fold_triton.py
echo "== data"; time python3 bench/random_data.py --preset kimi-k2 --out /tmp/kimi --samples 96 --length 2048
run() { python3 -m training train --data /tmp/kimi --preset kimi-k2 --max-seq-len 92160 --ttt-steps 5 \
  --checkpoint-ttt --freeze-lm-head --gpu-mem-gib 96 --steps ${STEPS:-6} --save-every 0 --device cuda --out "$@"; }
echo "== train 92160 x 5"; { time run /tmp/run92k; } 2>&1 | tee $OUT/train-92160.log | tail -14
cp /tmp/run92k/metrics.jsonl $OUT/metrics-92160.jsonl
if grep -q '"loss": NaN\|"grad_norm": NaN' /tmp/run92k/metrics.jsonl; then
  echo "== still NaN: the probe"
  python3 bench/nonfinite_probe.py train --data /tmp/kimi --preset kimi-k2 --max-seq-len 92160 --ttt-steps 5 \
    --checkpoint-ttt --freeze-lm-head --gpu-mem-gib 96 --steps 1 --save-every 0 --device cuda --out /tmp/probe 2>&1 | tee $OUT/probe.log | tail -40
fi
