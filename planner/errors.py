"""User-facing errors: each carries one sentence that the CLI prints before exiting non-zero."""


class PlanError(Exception):
    """Bad input or an impossible request; the message is one sentence for the user (exit code 1)."""

    exit_code = 1


class NoFitError(PlanError):
    """No layout fits in memory; the message names the binding constraint and what would fit (exit code 2)."""

    exit_code = 2


def read_json(path, what: str):
    """The JSON in `path`, or a PlanError naming `what` ("plan file", "profile", ...) and the path."""
    import json
    from pathlib import Path

    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise PlanError(f"{what} '{path}' does not exist") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PlanError(f"{what} '{path}' is not readable JSON ({exc.__class__.__name__})") from None
