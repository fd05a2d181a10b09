"""`plan validate plan.json`: run a plan for a few steps and compare the measurement with the prediction.

    plan validate plan.json [more.json ...] [--steps N] [--warmup W] [--device cuda|cpu] [--append FILE]
                  [--profile P] [--no-trace]

Several plans are run by one torchrun per world size, one plan after another in the same workers (one
start-up instead of one per plan; a sweep of 80 small plans fits in minutes). If a plan fails (out of
memory, a crash, its share of --timeout), the plans after it start again in a new torchrun; each plan's
result is reported on its own, and the exit code is non-zero if any failed.

Launches the plan through runtime.launch (its checks, then torchrun running runtime.train) into a per-step
CSV in a temporary folder, then takes the steady state: the median step time and the largest peak memory
over all ranks of the steps after the first W. The plan is re-predicted with the planner's cost model
(`planner.cost.evaluate`, with --profile or the profile shipped for the plan's GPU) and both are printed
with their relative error, per component where the runtime times it: the optimizer step (clip + AdamW,
CUDA events) and the pipeline bubble (pp > 1, from the schedule's action timeline); the rest of the step
(compute, recompute and exposed communication) is compared as one remainder.

On CUDA (unless --no-trace) the workers then run one extra step under torch.profiler, GPU kernels only; it is
not in the per-step CSV, so neither the median nor the peak memory sees it. Every rank splits its kernel
timeline into GPU compute (non-NCCL kernels), exposed communication (NCCL kernels with no compute beside them)
and GPU idle (span less busy: bubble, host gaps, waits). The rank with the largest span is compared with the
prediction: compute + recompute + optimizer, tp/cp/ep/dp/pp communication, bubble + host; in seconds and as
fractions of the traced span and the predicted step (the profiler can slow the traced step a little, so its
span is shown beside the steady median). On CPU the report says the components are not traced.

`--append FILE` adds one row (columns: planner.calibrate.RESULT_COLUMNS) to a results CSV, writing the
header when the file is new and refusing a file with other columns; existing rows are never rewritten.
Beside it, `<FILE stem>.plans.jsonl` gets the plan itself (row number -> plan), which `plan calibrate`
needs to re-predict the row exactly (the CSV's columns do not carry the sharding level), and the traced step's
per-rank components where there are some.

This module runs the plans and holds the command line; runtime/validation/ measures (`measure`), compares and
reports (`compare`) and writes the results row (`results`).
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import math
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from planner.errors import PlanError
from planner.plan import Plan
from runtime import gpu_monitor
from runtime.validation.compare import COMPONENTS, components_report, predicted_components_s, report  # noqa: F401 (re-exported)
from runtime.validation.measure import TracedStep, _steady, read_components
from runtime.validation.results import append_row, check_results_file, gpu_name, profile_label, result_row


def build_parser() -> argparse.ArgumentParser:
    from planner.arguments import Parser  # argparse errors as one sentence, exit 1
    from planner.limits import MAX_SECONDS, MAX_STEPS, float_arg, int_arg

    ap = Parser(prog="plan validate", description="Run a plan for a few steps; predicted vs measured.")
    ap.add_argument("plan", nargs="+", help="plan.json written by `plan -o` (several: run one after another)")
    ap.add_argument("--steps", type=int_arg("--steps", 1, MAX_STEPS), default=10, help="training steps to run (default 10)")
    ap.add_argument("--warmup", type=int_arg("--warmup", 0, MAX_STEPS), default=3, help="first steps left out of the steady state (default 3)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--append", metavar="FILE", help="add one row to this results CSV (created with its header if new)")
    ap.add_argument("--profile", help="profile for the prediction (default: the one shipped for the plan's GPU)")
    ap.add_argument("--allow-other-gpu-profile", action="store_true",
                    help="accept a --profile measured on another GPU kind than the plan's (refused otherwise)")
    ap.add_argument("--data", default="synthetic")
    ap.add_argument("--timeout", type=float_arg("--timeout", 0.0, MAX_SECONDS, lo_open=False), default=0,
                    help="stop a run after this many seconds per plan (0: no limit)")
    ap.add_argument("--keep-steps", metavar="CSV", help="keep the per-step CSV at this path (must not exist)")
    ap.add_argument("--no-trace", action="store_true",
                    help="skip the extra step traced after the measured ones (GPU compute, exposed communication "
                         "and idle time per rank; CUDA only)")
    return ap


def _run(cmd: list[str], env: dict, timeout: float, ranks: range = range(0)) -> int | None:
    """torchrun in its own process group, killed if this process dies (its workers die with it:
    runtime/supervise.py); on timeout (returns None) or SIGTERM the whole group is stopped (SIGTERM, then SIGKILL
    after 15 s), so no worker outlives this process and holds the GPUs. A dead or hung rank of `ranks` ends the
    run within supervise.DEFAULT_TIMEOUT_S with one sentence (returns 1)."""
    from runtime import supervise

    with tempfile.TemporaryDirectory(prefix="plan-validate-") as tmp:
        beats = Path(tmp) / "heartbeat"
        beats.mkdir()
        env, job = supervise.job_env({**env, supervise.HEARTBEAT_DIR_ENV: str(beats)})  # the monitor ends them all
        proc = subprocess.Popen(cmd, env=env, start_new_session=True,
                                preexec_fn=supervise.preexec_bound_to(os.getpid()))

        def stop(*_):
            for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    return
                try:
                    proc.wait(wait)
                    return
                except subprocess.TimeoutExpired:
                    continue

        old = signal.signal(signal.SIGTERM, lambda *a: (stop(), sys.exit(143)))
        try:
            with supervise.Monitor(beats, ranks, supervise.DEFAULT_TIMEOUT_S, proc, job_id=job) as monitor:
                proc.wait(timeout if timeout > 0 else None)
        except subprocess.TimeoutExpired:
            stop()
            return None
        except KeyboardInterrupt:
            stop()
            raise
        finally:
            signal.signal(signal.SIGTERM, old)
    if monitor.verdict is not None and monitor.killed:
        sentence = supervise.verdict_sentence(monitor.verdict, supervise.DEFAULT_TIMEOUT_S, "", "nothing was saved")
        print(f"plan: {sentence}", file=sys.stderr)
        return 1
    return proc.returncode


def _run_plans(args, files: list[Path], out: Path) -> dict[str, str]:
    """Run plan files of one world size in as few torchruns as failures allow: after a plan fails, the next
    torchrun starts at the plan after it. Returns stem -> failure sentence for the plans that did not finish
    (their per-step CSVs, if any, are ignored). Each torchrun is told its results in the form its number of plans
    asks for (runtime/train.py): a folder for several, a file for one, the last one left after a failure too."""
    from runtime import launch

    failed: dict[str, str] = {}
    remaining = list(files)
    while remaining:
        largs = launch.build_parser().parse_args([str(remaining[0]), "--steps", str(args.steps), "--device",
                                                  args.device, "--data", args.data, "--results", str(out)])
        _, nproc = launch.check_plan_on_machine(largs)
        many = len(remaining) > 1
        components = None if args.no_trace else out if many else out / f"{remaining[0].stem}.components.json"
        cmd = launch.torchrun_command(largs, nproc, out if many else out / f"{remaining[0].stem}.csv",
                                      plans=[str(f) for f in remaining] if many else None, components=components)
        rc = _run(cmd, launch.worker_env(args.device), args.timeout * len(remaining) + (30 if args.timeout else 0),
                  range(nproc))
        done = [f for f in remaining if not many or (out / f"{f.stem}.done").exists()]
        if rc == 0 and len(done) == len(remaining):
            break
        left = [f for f in remaining if f not in done] if many else remaining
        if not left:
            break
        why = "did not finish within its --timeout share" if rc is None else f"exited with code {rc}"
        failed[left[0].stem] = f"the training run {why} (its output is above); nothing was recorded"
        remaining = left[1:]
    return failed


def _worker_env(device: str) -> dict:
    from runtime import launch

    return launch.worker_env(device)


def validate(args) -> int:
    from planner.cluster import ClusterSpec
    from planner.cost import evaluate
    from planner.profile import load_profile

    if not (math.isfinite(args.timeout) and args.timeout >= 0):
        raise PlanError(f"--timeout must be 0 (no limit) or a number of seconds, got {args.timeout}")
    if args.steps < 1 or args.warmup < 0 or args.steps <= args.warmup:
        raise PlanError(f"--steps ({args.steps}) must exceed --warmup ({args.warmup}) so that some steps are measured")
    plans = [Plan.load(Path(p)) for p in args.plan]
    preds = []
    profiles: dict = {}  # one load per GPU kind, not per plan
    for plan in plans:
        cluster = ClusterSpec.from_dict(plan.cluster)
        if cluster.gpu not in profiles:
            profiles[cluster.gpu] = load_profile(args.profile, cluster.gpu, args.allow_other_gpu_profile)
        preds.append(evaluate(plan, cluster, profiles[cluster.gpu], "ours"))  # what runs is our runtime, whatever the plan was predicted for
    append = Path(args.append) if args.append else None
    if append:
        check_results_file(append)  # refuse a foreign file before spending the run
    if args.keep_steps and (len(plans) > 1 or Path(args.keep_steps).exists()):
        raise PlanError(f"'{args.keep_steps}' already exists; pick another --keep-steps path" if len(plans) == 1
                        else "--keep-steps takes a single plan")
    if args.keep_steps:
        from planner.outputs import check_output_file
        check_output_file(Path(args.keep_steps), "--keep-steps")
    failures = 0
    with tempfile.TemporaryDirectory(prefix="plan-validate-") as tmp:
        tmp = Path(tmp)
        files = []
        for i, (src, plan) in enumerate(zip(args.plan, plans)):  # unique stems, in the order given
            f = tmp / f"{i:04d}.json"
            f.write_text(Path(src).read_text())
            files.append(f)
        failed: dict[str, str] = {}
        stopped, ran = None, set()
        monitor = gpu_monitor.GpuMonitor() if args.device == "cuda" else None
        try:
            with monitor or contextlib.nullcontext():
                for world in dict.fromkeys(p.layout.world_size for p in plans):
                    group = [f for f, p in zip(files, plans) if p.layout.world_size == world]
                    failed.update(_run_plans(args, group, tmp))
                    ran.update(f.stem for f in group)
        except SystemExit as exc:  # SIGTERM (a wall-clock limit, say): still report and append what finished
            stopped = exc.code if isinstance(exc.code, int) else 143
            for f in files:
                if f.stem not in failed and f.stem not in ran and not (tmp / f"{f.stem}.done").exists():
                    failed[f.stem] = "validation was stopped (SIGTERM) before this plan finished"
        samples = monitor.samples() if monitor else []
        for src, f, plan, pred in zip(args.plan, files, plans, preds):
            head = f"--- {src}" if len(plans) > 1 else None
            try:
                if f.stem in failed:
                    raise PlanError(failed[f.stem])
                steps_csv = tmp / f"{f.stem}.csv"
                try:
                    with open(steps_csv, newline="") as fh:
                        rows = list(csv.DictReader(fh))
                except FileNotFoundError:
                    raise PlanError("the training run wrote no per-step results") from None
                if len(rows) <= args.warmup:
                    raise PlanError(f"the run recorded {len(rows)} steps, not more than the {args.warmup} warm-up steps")
                if args.keep_steps:
                    Path(args.keep_steps).parent.mkdir(parents=True, exist_ok=True)
                    Path(args.keep_steps).write_text(steps_csv.read_text())
                meas = _steady(rows, args.warmup)
                meas["components"] = ("not traced (--no-trace)" if args.no_trace
                                      else read_components(tmp / f"{f.stem}.components.json"))
                if samples and meas["window_unix_s"]:
                    meas["gpu_state"] = gpu_monitor.summarize(
                        samples, *meas["window_unix_s"],
                        gpu_monitor.visible_gpu_indexes(plan.layout.world_size, _worker_env(args.device)))
                if head:
                    print(head)
                print(report(plan, pred, meas), flush=True)
                if append:
                    label = profile_label(args.profile, ClusterSpec.from_dict(plan.cluster).gpu)
                    row = result_row(plan, pred, meas, gpu_name(args.device), label)
                    traced = meas["components"] if isinstance(meas["components"], TracedStep) else None
                    n = append_row(append, row, plan, meas.get("gpu_state"), traced)
                    print(f"appended row {n} to {append}")
            except PlanError as exc:
                if len(plans) == 1:
                    raise
                failures += 1
                print(f"{head}\nplan: {exc}", file=sys.stderr, flush=True)
    if failures:
        print(f"plan: {failures} of {len(plans)} plans failed; the others are reported above", file=sys.stderr)
    if stopped is not None:
        return stopped
    return 1 if failures else 0


def main(argv=None) -> int:
    try:
        if "--simulate" in (argv if argv is not None else sys.argv[1:]):  # runtime/simulate: no training run
            from runtime.simulate.__main__ import main as simulate
            return simulate([a for a in (argv if argv is not None else sys.argv[1:]) if a != "--simulate"])
        args = build_parser().parse_args(argv)
        return validate(args)
    except PlanError as exc:
        print(f"plan: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
