"""The flight recorder of each host: its GPUs, their processes, its tmux panes and the
sizes of its logs, recorded under the runs root by a tmux session of its own (agent.py,
started by start.py), read back by read.py."""
