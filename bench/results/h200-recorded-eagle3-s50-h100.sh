#!/usr/bin/env bash
# Issue 47 on the device, session 50, second try: the recorder beside a real run, replayable.
# (The call before found a recorder already running for the operator loop's temporary runs
# root: `record start` said "running" and ~/.trackside/runs/gpu/ never came.) So: stop that
# recorder, start it for this runs root, train EAGLE-3 llama3-8b 8192 × TTT 5 launched into
# tmux, `trackside kill` it at ~210 s, bring the runs root back for `trackside replay`.
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PATH=/tmp/bin:$PATH
tmux kill-session -t "=trackside-recorder" 2>/dev/null
trackside record start | tee $OUT/record-start.txt
python3 bench/random_data.py --preset llama3-8b --out /tmp/l8-data --samples 400 --length 2048 > /dev/null
trackside launch --session eagle3-rec -- trackside train --data /tmp/l8-data --preset llama3-8b --ttt-steps 5 \
  --freeze-lm-head --max-seq-len 8192 --steps 100000 --save-every 0 --device cuda 2>&1 | tee $OUT/launch.txt
rd=$(ls -td ~/.trackside/runs/2*/ | head -1); echo "run dir $rd"
until [ $SECONDS -gt 215 ]; do sleep 2; done
trackside kill eagle3-rec 2>&1 | tail -5 | tee $OUT/kill.txt
sleep 8; trackside watch --since 10m 2>&1 | tail -10 | tee $OUT/watch-since.txt
du -sb ~/.trackside/runs/gpu; ls -la ~/.trackside/runs/gpu
tar -C ~/.trackside -czf $OUT/runs-root.tgz --exclude='*.safetensors' --exclude='checkpoint*' --exclude='*.pt' runs
