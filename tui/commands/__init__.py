"""The terminal's headless face, beside the dashboard: each `trackside` subcommand's
argument parser and output, one module per subcommand or small group. They call
`backends/` (a library: no parsing, no printing) as the dashboard does, so a command and
its key do the same thing; `tui/cli.py` hands each subcommand to its module.

- `dashboard`: `trackside [--config PATH]` and `trackside demo`
- `headless`: `launch|runs|gpus|kill|relaunch`, their shared flags and exit codes, with
  `launch` (launch, relaunch), `runs`, `gpus` and `kill` for each one's own
- `watch`, `plot`, `serve`, `record`, `replay`: `trackside watch|plot|serve|record|replay`; `served`: the dashboard one
  browser page of `serve` runs (the server's child, which dies with it)
- `shared`: the parser whose errors are usage errors, and aligned columns
"""

# Each subcommand's line in `trackside --help`, in the order a newcomer meets them.
SUMMARIES = {
    "demo": "the dashboard on this machine, over a small CPU training run it launches",
    "launch": "run a command (after --) in a new tmux session with a run directory",
    "runs": "list the runs and every other tmux session on the hosts",
    "gpus": "read the hosts' GPUs once: power, memory, utilisation, their processes",
    "kill": "stop a run's own process tree, then verify its GPU memory is released",
    "relaunch": "launch a run again with changed parameters (--set KEY=VALUE)",
    "plot": "runs' curves in the plain terminal",
    "watch": "the dashboard's alerts as lines, and the config's alert command on each",
    "replay": "a run's screen as it was at a moment, stepped through its past (read-only)",
    "serve": "the dashboard in a browser page",
    "record": "start, check or stop the hosts' GPU recorders (any command starts one)",
    "train": "train an EAGLE-3 or DFlash drafter on hidden states",
    "extract": "capture a causal LM's hidden states into a data directory",
    "fit": "predict a step's peak GPU memory and the largest max_seq_len that fits",
}
