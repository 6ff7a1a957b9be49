"""The terminal's headless face, beside the dashboard: each `trackside` subcommand's
argument parser and output, one module per subcommand or small group. They call
`backends/` (a library: no parsing, no printing) as the dashboard does, so a command and
its key do the same thing; `tui/cli.py` hands each subcommand to its module.

- `dashboard`: `trackside [--config PATH]` and `trackside demo`
- `headless`: `launch|runs|gpus|kill|relaunch`, their shared flags and exit codes, with
  `launch` (launch, relaunch), `runs`, `gpus` and `kill` for each one's own
- `watch`, `plot`, `serve`: `trackside watch|plot|serve`
- `shared`: the parser whose errors are usage errors, and aligned columns
"""
