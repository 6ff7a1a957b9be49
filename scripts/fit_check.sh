#!/usr/bin/env bash
# On a GPU: launch the real trainer at the max_seq_len `trackside fit` names for a drafter
# under a memory cap, and at the next multiple up, and show each run's peak and outcome.
#   bash scripts/fit_check.sh kimi-k2 96 5
set -uo pipefail
cd "$(dirname "$0")/.."
preset=${1:-kimi-k2} cap=${2:-96} ttt=${3:-5}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
fit=$(python3 -m training fit --preset "$preset" --gpu-mem-gib "$cap" --ttt-steps "$ttt" --probe \
      --calibration /tmp/fit-"$preset".json --json) || exit 1
largest=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["largest_max_seq_len"][sys.argv[2]])' "$fit" "$ttt")
echo "fit --probe: largest max_seq_len at TTT $ttt under $cap GiB: $largest"
python3 bench/random_data.py --preset "$preset" --out /tmp/data-"$preset" --samples 24 --length 2048
for len in "$largest" $((largest + 1024)); do
  cmd=(python3 -m training train --data /tmp/data-"$preset" --preset "$preset" --device cuda
       --max-seq-len "$len" --ttt-steps "$ttt" --steps 3 --gpu-mem-gib "$cap" --save-every 0
       --out /tmp/fit-run-"$len")
  echo "+ ${cmd[*]}"
  "${cmd[@]}" > /tmp/fit-run-"$len".log 2>&1
  echo "exit status $? (3 = out of memory)"
  grep -E '^step=|oom' /tmp/fit-run-"$len".log | tail -3
done
