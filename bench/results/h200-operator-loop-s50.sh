#!/usr/bin/env bash
# Issue 45 item 4 on the device, session 50: the operator's loop for both drafters with the
# resume reading the stopped run's RAM stage (training/ram_stage.py; `resume_source` in the
# start event), DFlash first (its R with `c` waited 10.5 s for the writer before), then the
# GPU-marked tests in what is left of the call (the drafter code moved into its folders).
# Run from the tree's root, wheels in ../.whl-tui.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site ../.whl-tui/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,power.limit --format=csv,noheader | tee $OUT/card.txt
timeout -s KILL 230 python3 bench/operator_loop.py --drafter dflash > $OUT/operator-loop-dflash.log 2>&1
echo "dflash rc=$? at ${SECONDS} s"; tail -c 2500 $OUT/operator-loop-dflash.log
timeout -s KILL 200 python3 bench/operator_loop.py --drafter eagle3 > $OUT/operator-loop-eagle3.log 2>&1
echo "eagle3 rc=$? at ${SECONDS} s"; tail -c 2500 $OUT/operator-loop-eagle3.log
left=$((580 - SECONDS)); echo "GPU tests with ${left} s left"
[ "$left" -gt 30 ] && timeout -s KILL $left python3 -m pytest -m gpu -p no:cacheprovider -o addopts= -q -x tests/training \
  > $OUT/gpu-tests.log 2>&1; echo "gpu tests rc=$?"; tail -15 $OUT/gpu-tests.log
