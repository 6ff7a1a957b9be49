"""`python -m training train …`: the trainer without the dashboard's entry point."""
import sys

from training.cli import exit_process, main

code = main()
if sys.argv[1:2] == ["train"]:
    exit_process(code)
sys.exit(code)
