#!/usr/bin/env bash
# Session 15, H200 call 3: the GPU-marked tests (tests/training, tests/backends) with their
# durations, then one-GPU torchrun runs of each drafter under --sharding fsdp (torch 2.11's
# FSDP and EAGLE-3's plain-tensor step outputs): their step events must carry a non-zero
# grad_norm and a falling loss.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
PYTEST_ADDOPTS="--durations=12" timeout 420 bash scripts/gpu_check.sh tests >/dev/null 2>&1
tail -25 $OUT/gpu-tests.log
for drafter in eagle3 dflash; do
  extra=(); [ $drafter = dflash ] && extra=(--max-anchors 64 --block-size 4)
  timeout 80 torchrun --standalone --nproc-per-node 1 -m training train --synthetic \
    --drafter $drafter "${extra[@]}" --sharding fsdp --steps 30 --device cuda \
    --out /tmp/fsdp-$drafter > $OUT/fsdp-$drafter.log 2>&1; echo "$drafter exit $?"
  python3 - /tmp/fsdp-$drafter/metrics.jsonl <<'PY'
import json, sys
steps = [e for e in map(json.loads, open(sys.argv[1])) if e["event"] == "step"]
print(f"steps={len(steps)} grad_norm first={steps[0]['grad_norm']:.3g} "
      f"min={min(e['grad_norm'] for e in steps):.3g} loss first={steps[0]['loss']:.3f} "
      f"last={steps[-1]['loss']:.3f}")
PY
done
