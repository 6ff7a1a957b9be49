"""`python -m training train …`: the trainer without the dashboard's entry point."""
import sys

from training.cli import main

sys.exit(main())
