#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: the GPU-marked tests, then a short Llama-3.1-8B-shaped
# training run (max_seq_len 8192, TTT 5, bf16) whose step events give tokens/s and peak GiB.
# Uses the python3 on PATH (torch with CUDA); wheels in .whl/ are installed to /tmp/site first
# (for machines without network). Results go to ${OUT:-/tmp/trackside-gpu}.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/trackside-gpu}; mkdir -p "$out"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=index,name,power.limit,memory.total,driver_version --format=csv
python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name())'

step=${1:-all}
if [ "$step" = all ] || [ "$step" = tests ]; then
  python3 -m pytest -m gpu -p no:cacheprovider -o addopts= -s -q tests/training tests/backends 2>&1 | tee "$out/gpu-tests.log"
fi
if [ "$step" = all ] || [ "$step" = train ]; then
  python3 bench/random_data.py --preset llama3-8b --out /tmp/data-llama3-8b --samples 40 --length 2048
  cmd=(python3 -m training train --data /tmp/data-llama3-8b --preset llama3-8b
       --max-seq-len 8192 --ttt-steps 5 --steps 30 --device cuda --out /tmp/run-llama3-8b)
  echo "+ ${cmd[*]}"
  /usr/bin/time -v "${cmd[@]}" 2>&1 | tail -60 | tee "$out/train-llama3-8b.log"
  cp /tmp/run-llama3-8b/metrics.jsonl "$out/metrics-llama3-8b.jsonl"
  python3 - "$out/metrics-llama3-8b.jsonl" <<'PY'
import json, statistics, sys
steps = [e for e in map(json.loads, open(sys.argv[1])) if e["event"] == "step"]
late = steps[5:] or steps
print(f"steps={len(steps)} median tokens/s (after 5 warm-up steps)="
      f"{statistics.median(e['tokens_per_s'] for e in late):.0f} "
      f"peak_mem_gib={max(e['peak_mem_gib'] for e in steps):.2f} "
      f"loss first={steps[0]['loss']:.3f} last={steps[-1]['loss']:.3f}")
PY
fi
