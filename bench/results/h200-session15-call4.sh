#!/usr/bin/env bash
# Session 15, H200 call 4: the story's configuration with the story's own loss (the eager,
# unfused pass: float32 softmaxes of both sides) unchunked under the 95 GiB cap, on this
# session's trainer: bench/dflash_step.py's story child of that kind, alone.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout 170 python3 - <<'PY' 2>&1 | tee $OUT/story-eager-unchunked.log
import json, os, sys
sys.argv = ["dflash_step.py"]
sys.path.insert(0, "bench")
import dflash_step as bench
story = bench.STORY
whole = {**story, "trainer": "trackside", "steps": 1, "warmup": 0, "cap_gib": 95,
         "profile": 0, "loss_chunk": story["max_anchors"] * (story["block_size"] - 1),
         "loss_pass": "eager"}
result = bench.run_child(whole, 150)
print(bench.describe(result))
open(os.path.join(os.environ["OUT"], "story-eager-unchunked.json"), "w").write(json.dumps(result))
PY
