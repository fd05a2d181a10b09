"""`plan validate`'s parts besides running the plans (runtime/validate.py), one concern a module:

- `measure`: the steady state of a run's per-step CSV; the traced step's per-rank components (`TracedStep`)
- `compare`: the printed report, prediction against measurement, per component where the runtime times it
- `results`: the `--append` results CSV's row and its sidecar record
"""
