"""`python -m runtime.simulate plan.json [--ranks all|R,R,...] [--json] [-o DIR]`: simulate a plan's ranks.

Each rank runs in a process of its own (`--one-rank R --result FILE`: a fresh fake world per rank), --jobs of
them at once; this process gathers their results and prints the table or the JSON object (-o DIR also writes it to
DIR/simulation.json). A plan that breaks a rule of planner/legality.py is refused in one sentence naming the rule
before any rank process starts (Plan.load); a rank whose build or step still fails is refused in one sentence naming
the rank, without a traceback."""
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
    from planner.arguments import Parser, positive_int

    ap = Parser(prog="plan validate PLAN --simulate",
                description="Build and step a plan's ranks under a fake process group and fake "
                            "tensors; traced memory and collectives beside the prediction.")
    ap.add_argument("plan")
    ap.add_argument("--ranks", default=None, help="'all' or a comma-separated list (default: one of each role)")
    ap.add_argument("--steps", type=positive_int("--steps"), default=1,
                    help="steps per rank; the last is traced (default 1)")
    ap.add_argument("--jobs", type=positive_int("--jobs"), default=max(1, min(2, os.cpu_count() or 1)),
                    help="ranks simulated at once, each a process of one core (default: 2, or 1 on one core)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("-o", "--output", default=None, help="folder for simulation.json")
    ap.add_argument("--force", action="store_true", help="overwrite an existing DIR/simulation.json")
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

    from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException

    plan = Plan.load(Path(args.plan))
    try:
        out = rank_json(simulate_rank(plan, args.one_rank, args.steps))
    except (DataDependentOutputException, DynamicOutputShapeException) as exc:
        out = {"rank": args.one_rank, "error": f"the step reads a tensor's values back to the host ({exc.func}), which "
               "fake tensors do not hold: MoE layers read their routed token counts so where they loop over their "
               "experts or drop tokens by capacity (runtime/parallel/expert.py), and the simulation does not run "
               "those paths yet"}
    except Exception as exc:  # noqa: BLE001 (any failure of the build or step is the rank's one-sentence refusal)
        out = {"rank": args.one_rank, "error": _sentence(exc)}
    Path(args.result).write_text(json.dumps(out) + "\n")
    return 0


def _sentence(exc: BaseException) -> str:
    """An exception as one line: its type and the first line of its message (no traceback)."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _rank_command(plan_path: str, rank: int, result: Path, steps: int) -> list[str]:
    return [sys.executable, "-m", "runtime.simulate", plan_path, "--one-rank", str(rank), "--result", str(result),
            "--steps", str(steps)]


def _collect(rank: int, result: Path, proc: subprocess.Popen) -> dict:
    """A finished rank's JSON entry; a rank that failed is refused in one sentence naming it."""
    out, err = proc.communicate()
    if not result.exists():  # the child died before writing its result (killed, out of memory, ...)
        lines = [line.strip() for line in (err or out or "").splitlines() if line.strip()]
        raise PlanError(f"the simulation of rank {rank} stopped without a result (exit code {proc.returncode}): "
                        f"{lines[-1] if lines else 'no output'}")
    entry = json.loads(result.read_text())
    if "error" in entry:
        raise PlanError(f"rank {rank} of the plan cannot be built and stepped: {entry['error']}")
    return entry


def simulate_ranks(plan_path: str, ranks: list[int], steps: int = 1, jobs: int = 1) -> list[dict]:
    """Each rank in its own `python -m runtime.simulate --one-rank` process, at most `jobs` at once; their JSON
    entries in the order of `ranks`."""
    entries: dict[int, dict] = {}
    with tempfile.TemporaryDirectory(prefix="plan-simulate-") as tmp:
        running: list[tuple[int, Path, subprocess.Popen]] = []
        try:
            for r in ranks + [None] * jobs:
                while running and (r is None or len(running) >= jobs):
                    rank, result, proc = running.pop(0)
                    entries[rank] = _collect(rank, result, proc)
                if r is not None:
                    result = Path(tmp) / f"rank{r}.json"
                    proc = subprocess.Popen(_rank_command(plan_path, r, result, steps), stdout=subprocess.PIPE,
                                            stderr=subprocess.PIPE, text=True, env=dict(os.environ))
                    running.append((r, result, proc))
        finally:  # a refused rank: the others still running are stopped
            for _, _, proc in running:
                proc.kill()
                proc.communicate()
    return [entries[r] for r in ranks]


def main(argv=None) -> int:
    """`plan validate PLAN --simulate ...` (runtime/validate.py hands its arguments here) and the child processes."""
    args = parse_args(argv)
    if args.one_rank is not None:
        return _one_rank(args)
    from planner.legality import ours_violation
    from planner.plan import Plan
    from runtime.simulate.report import table
    from runtime.simulate.roles import parse_ranks

    if args.output:  # checked before any rank: a simulation takes minutes
        from planner.outputs import check_output_folder
        check_output_folder(Path(args.output), "-o", ("simulation.json",), overwrite=args.force)
    plan = Plan.load(Path(args.plan))  # a plan that breaks a rule of planner/legality.py stops here, before any rank
    why = ours_violation(plan.layout)
    if why:  # a plan priced for another runtime target: its program in ours cannot be built
        raise PlanError(f"the simulation builds our runtime's program: {why}")
    ranks = parse_ranks(args.ranks, plan.layout)
    entries = simulate_ranks(args.plan, ranks, args.steps, args.jobs)
    obj = {"plan": args.plan, "model": plan.model.name, "layout": plan.layout.short(),
           "world_size": plan.layout.world_size, "ranks": entries}
    if args.output:
        from planner.outputs import write_file
        Path(args.output).mkdir(exist_ok=True)
        write_file(Path(args.output) / "simulation.json", json.dumps(obj, indent=1) + "\n")
    print(json.dumps(obj, indent=1) if args.json else table(f"{plan.model.name} {plan.layout.short()}", entries))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except PlanError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
