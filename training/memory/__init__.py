"""What either drafter's memory model (training/drafters/*/memory) counts in and shares:
bytes and dtypes (``units``), what one rank holds of the trained parameters, whole or
sharded (``state``), a predicted peak and whether it fits a card (``peak``), and what a run
measured, from its metrics (``measured``). Plain arithmetic, no torch: the dashboard
predicts an edit's memory on an operator's laptop."""
