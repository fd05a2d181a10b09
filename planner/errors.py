"""User-facing errors: each carries one sentence that the CLI prints before exiting non-zero."""


class PlanError(Exception):
    """Bad input or an impossible request; the message is one sentence for the user (exit code 1)."""

    exit_code = 1


class NoFitError(PlanError):
    """No layout fits in memory; the message names the binding constraint and what would fit (exit code 2)."""

    exit_code = 2


def read_json(path, what: str, missing: str | None = None):
    """The JSON in `path`, or a PlanError naming `what` ("plan file", "profile", ...) and the path (the sentence
    `missing` where it does not exist); read within the bounds of planner/json_input.py (a regular file, a size
    cap, bounded nesting and integers)."""
    from planner import json_input

    try:
        return json_input.read_json(path, what, missing)
    except json_input.InputError as exc:
        raise PlanError(str(exc)) from None
