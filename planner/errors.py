"""User-facing errors: each carries one sentence that the CLI prints before exiting non-zero."""


class PlanError(Exception):
    """Bad input or an impossible request; the message is one sentence for the user (exit code 1)."""

    exit_code = 1


class NoFitError(PlanError):
    """No layout fits in memory; the message names the binding constraint and what would fit (exit code 2)."""

    exit_code = 2
