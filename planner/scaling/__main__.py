"""`python -m planner.scaling ...`: the same as `plan scaling ...`."""
import sys

from planner.cli import main as cli_main

sys.exit(cli_main(["scaling"] + sys.argv[1:]))
