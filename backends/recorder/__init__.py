"""The flight recorder of each host: its GPUs, their processes, its tmux panes and the
sizes of its logs, recorded under the runs root by a tmux session of its own (agent.py,
its files kept by files.py, started by start.py), laid out as layout.py says, read back by
read.py."""
