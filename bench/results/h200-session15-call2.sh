#!/usr/bin/env bash
# Session 15, H200 call 2, as run (one command line): the GPU-marked tests, cut short by
# their 250 s timeout after 29 of 37 passed (call 3 ran them whole), then the dashboard
# supervising a DFlash run end to end.
set -uo pipefail; python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1; git log --oneline | head -1; timeout 250 bash scripts/gpu_check.sh tests > /dev/null 2>&1; tail -5 $OUT/gpu-tests.log; timeout 330 python3 scripts/gpu_e2e.py --drafter dflash 2>&1 | tail -40; ls $OUT
