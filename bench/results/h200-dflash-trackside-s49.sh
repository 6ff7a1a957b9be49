#!/usr/bin/env bash
# Issue 45 item 3, session 49 call 3, on the machine of call 2 still warm (an H100): the
# trackside DFlash children that call 2's time limit cut after speculators' (239 s first
# step), same shape, flags and profile.
set -uo pipefail
cd .dev45 && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
(ls /tmp/site >/dev/null 2>&1 || python3 -m pip install -q --no-index --no-deps --no-compile \
  --no-cache-dir --upgrade --target /tmp/site ../.whl/*.whl)
timeout 200 python3 bench/dflash_step.py --trainers trackside --tokens-in-step --steps 8 \
  --warmup 2 --profile 40 --timeout 95 2>&1 | tee $OUT/dflash-trackside.log
