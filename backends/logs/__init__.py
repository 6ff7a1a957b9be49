"""Reading what a pane or a log printed: metrics.jsonl folded (`record`), a file followed
over SSH (`streams`), a pane's bytes recorded (`recording`) and replayed as a terminal draws
them (`screen`), a console's lines read (`logparse`, and the shapes `wrapped`, `boxes`,
`rounds`, `eval_heading`, `training_bar`), folded (`console`) and found per pane (`panes`),
and a run's curves read whole (`series`). A library that prints a shape of its own is one
small module under `libraries/`, with its fixture.

Text another program wrote is made inert by backends.sanitize and its JSON read by
backends.untrusted_json: both stay beside this package, since manifests, process names and
session names cross the same boundary outside any log.
"""
