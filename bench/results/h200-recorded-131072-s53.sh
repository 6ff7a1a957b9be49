#!/usr/bin/env bash
# Issues 45 (item 1) and 47 on the H200, session 53 (session 50's call, which found no H200): kimi-k2 131,072 × TTT 5, recomputed,
# head frozen, --offload-saved under a 96 GiB cap for 32 steps, launched as an operator
# does (`trackside launch` into tmux) with the host's GPU recorder beside it (`trackside
# record start`), `fit`'s prediction first. Brings back the runs root (gpu/, the run dir
# without checkpoints, panes/) for `trackside replay`, the recorder's CPU from /proc, and
# `trackside watch --since` over the run. Run from the tree's root, wheels in ../.whl-tui.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site ../.whl-tui/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p /tmp/bin && printf '#!/bin/sh\nexec python3 -c "import sys; from tui.cli import main; sys.exit(main())" "$@"\n' > /tmp/bin/trackside
chmod +x /tmp/bin/trackside; export PATH=/tmp/bin:$PATH
nvidia-smi --query-gpu=name,memory.total,power.limit --format=csv,noheader | tee $OUT/card.txt
fit=(--preset kimi-k2 --gpu-mem-gib 96 --ttt-steps 5 --checkpoint-ttt --freeze-lm-head --max-seq-len 131072)
trackside fit "${fit[@]}" 2>&1 | head -3 | tee $OUT/fit-131072.txt
trackside fit "${fit[@]}" --offload-saved 2>&1 | head -4 | tee -a $OUT/fit-131072.txt
python3 bench/random_data.py --preset kimi-k2 --out /tmp/kimi-data --samples 60 --length 2048 > /dev/null
trackside record start | tee $OUT/record-start.txt
rec=$(tmux list-panes -a -F '#{session_name} #{pane_pid}' | awk '/^trackside-recorder-/ {print $2; exit}')  # one recorder per runs root, named from the root
began=$SECONDS; echo "data ready, recorder pid $rec at ${SECONDS} s"
trackside launch --session kimi131k -- trackside train --data /tmp/kimi-data --preset kimi-k2 --ttt-steps 5 \
  --checkpoint-ttt --freeze-lm-head --gpu-mem-gib 96 --save-every 0 --device cuda --offload-saved \
  --max-seq-len 131072 --steps 32 2>&1 | tee $OUT/launch.txt
rd=$(ls -td ~/.trackside/runs/*/ | grep -v '/gpu/\|/panes/' | head -1); echo "run dir $rd"
until [ -e "$rd/exit_status" ] || [ $SECONDS -gt 545 ]; do sleep 2; done
[ -e "$rd/exit_status" ] || trackside kill kimi131k | tee $OUT/kill.txt
echo "ended at ${SECONDS} s: $(cat $rd/exit_status 2>/dev/null)"
python3 - "$rec" $((SECONDS - began)) <<'PY' | tee $OUT/recorder-cpu.json
import json, os, sys
tick = os.sysconf("SC_CLK_TCK"); pane = int(sys.argv[1]); wall = float(sys.argv[2])
def stat(pid):
    return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
own = stat(pane); kids = [p for p in os.listdir("/proc") if p.isdigit() and stat(p)[1] == str(pane)]
own_s = (int(own[11]) + int(own[12])) / tick; reaped = (int(own[13]) + int(own[14])) / tick
loop = sum((int(stat(k)[11]) + int(stat(k)[12])) / tick for k in kids)
print(json.dumps({"wall_s": wall, "recorder_cpu_s": own_s, "reaped_cpu_s": reaped, "smi_loop_cpu_s": loop,
                  "percent_of_one_core": round(100 * (own_s + reaped + loop) / wall, 2)}))
PY
trackside watch --since 15m --once 2>&1 | tail -20 | tee $OUT/watch-since.txt
grep -h '"step"' $rd/metrics.jsonl | tail -3 | cut -c1-200
du -sb ~/.trackside/runs/gpu; ls -la ~/.trackside/runs/gpu
tar -C ~/.trackside -czf $OUT/runs-root.tgz --exclude='*.safetensors' --exclude='checkpoint*' --exclude='*.pt' runs
ls -la $OUT
