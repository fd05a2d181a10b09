"""`python -m runtime.simulate plan.json [--ranks all|R,R,...] [--json] [-o DIR]`: simulate a plan's ranks.

Each rank runs in a process of its own (`--one-rank R --result FILE`: a fresh fake world per rank), one after
another; this process gathers their results and prints the table or the JSON object (-o DIR also writes it to
DIR/simulation.json). A rank whose build or step fails is refused in one sentence naming the rank."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from planner.errors import PlanError


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="plan validate PLAN --simulate",
                                 description="Build and step a plan's ranks under a fake process group and fake "
                                             "tensors; traced memory and collectives beside the prediction.")
    ap.add_argument("plan")
    ap.add_argument("--ranks", default=None, help="'all' or a comma-separated list (default: one of each role)")
    ap.add_argument("--steps", type=int, default=1, help="steps per rank; the last is traced (default 1)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("-o", "--output", default=None, help="folder for simulation.json")
    ap.add_argument("--one-rank", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--result", default=None, help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def _one_rank(args) -> int:
    """Child process: simulate one rank and write its JSON entry (or its error) to args.result."""
    from runtime.simulate.fake_world import prepare_process

    prepare_process()
    import warnings

    warnings.filterwarnings("ignore")
    from planner.plan import Plan
    from runtime.simulate.report import rank_json
    from runtime.simulate.run import simulate_rank

    from torch._subclasses.fake_tensor import DataDependentOutputException

    plan = Plan.load(Path(args.plan))
    try:
        out = rank_json(simulate_rank(plan, args.one_rank, args.steps))
    except DataDependentOutputException as exc:
        out = {"rank": args.one_rank, "error": f"the step reads a tensor's values back to the host ({exc.func}), which "
               "fake tensors do not hold: MoE layers read their routed token counts so (runtime/parallel/"
               "expert_dispatch.py), and the simulation does not run them yet"}
    except (ValueError, RuntimeError, AssertionError, PlanError) as exc:
        out = {"rank": args.one_rank, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
    Path(args.result).write_text(json.dumps(out) + "\n")
    return 0


def simulate_ranks(plan_path: str, ranks: list[int], steps: int = 1) -> list[dict]:
    """Each rank in its own `python -m runtime.simulate --one-rank` process; their JSON entries in order."""
    entries = []
    with tempfile.TemporaryDirectory(prefix="plan-simulate-") as tmp:
        for r in ranks:
            result = Path(tmp) / f"rank{r}.json"
            cmd = [sys.executable, "-m", "runtime.simulate", plan_path, "--one-rank", str(r), "--result", str(result),
                   "--steps", str(steps)]
            proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))
            if not result.exists():
                tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
                raise PlanError(f"the simulation of rank {r} failed: {tail[0]}")
            entry = json.loads(result.read_text())
            if "error" in entry:
                raise PlanError(f"rank {r} of the plan cannot be built and stepped: {entry['error']}")
            entries.append(entry)
    return entries


def main(argv=None) -> int:
    """`plan validate PLAN --simulate ...` (runtime/validate.py hands its arguments here) and the child processes."""
    args = parse_args(argv)
    if args.one_rank is not None:
        return _one_rank(args)
    from planner.plan import Plan
    from runtime.simulate.report import table
    from runtime.simulate.roles import parse_ranks

    plan = Plan.load(Path(args.plan))
    ranks = parse_ranks(args.ranks, plan.layout)
    entries = simulate_ranks(args.plan, ranks, args.steps)
    obj = {"plan": args.plan, "model": plan.model.name, "layout": plan.layout.short(),
           "world_size": plan.layout.world_size, "ranks": entries}
    if args.output:
        Path(args.output).mkdir(parents=True, exist_ok=True)
        (Path(args.output) / "simulation.json").write_text(json.dumps(obj, indent=1) + "\n")
    print(json.dumps(obj, indent=1) if args.json else table(f"{plan.model.name} {plan.layout.short()}", entries))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except PlanError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
