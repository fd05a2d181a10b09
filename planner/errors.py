"""User-facing errors: each carries one sentence that the CLI prints before exiting non-zero."""


class PlanError(Exception):
    """Bad input or an impossible request; the message is one sentence for the user (exit code 1)."""

    exit_code = 1


class NoFitError(PlanError):
    """No layout fits in memory; the message names the binding constraint and what would fit (exit code 2)."""

    exit_code = 2


def read_json(path, what: str):
    """The JSON in `path`, or a PlanError naming `what` ("plan file", "profile", ...) and the path; read within the
    bounds of planner/json_input.py (a regular file, a size cap, bounded nesting and integers)."""
    from planner.json_input import read_json as bounded_read_json

    return bounded_read_json(path, what)
