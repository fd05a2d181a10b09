"""`python -m planner.scaling ...`: the same as `plan scaling ...`."""
import sys

from planner.arguments import run_command
from planner.scaling.command import main

sys.exit(run_command(main, sys.argv[1:]))
