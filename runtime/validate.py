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
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import datetime
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from planner.calibrate import RESULT_COLUMNS, recompute_text, sidecar_path
from planner.errors import PlanError
from planner.report import host_paced, host_paced_note
from planner.plan import Plan
from planner.provenance import commit_label
from runtime import gpu_monitor
from runtime.trace_analysis import RankComponents


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


def _gpu_name(device: str) -> str:
    if device != "cuda":
        return "cpu"
    import torch
    return torch.cuda.get_device_name(0)


def _check_results_file(path: Path) -> int:
    """Data rows already in the results CSV (0 when it does not exist); refuses a file with other columns, a
    folder, or a place it could not be written (checked before the run, not after it)."""
    from planner.outputs import check_output_file

    check_output_file(path, "--append", overwrite=True)  # an existing file is appended to, never rewritten
    if not path.exists():
        return 0
    with open(path, newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None:
            raise PlanError(f"results file '{path}' exists but is empty; remove it or pick another --append file")
        if header != RESULT_COLUMNS:
            raise PlanError(f"results file '{path}' has other columns than a validation results CSV; "
                            "pick another --append file")
        return sum(1 for row in reader if row)


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


def _steady(rows: list[dict], warmup: int) -> dict:
    steady = rows[warmup:]

    def col(name):
        vals = []
        for r in steady:
            try:
                vals.append(float(r.get(name) or "nan"))
            except ValueError:
                pass
        return [v for v in vals if v == v]

    mem = col("peak_mem_max_gib") or col("peak_mem_gib")
    opt, bubble = col("optimizer_s"), col("bubble_frac")
    ends = col("end_unix_s")
    # the measured steps' wall-clock span: from the end of the last warm-up step (or the first measured step's
    # start, its end less its time) to the end of the last
    window = None
    if ends and len(ends) == len(steady):
        first_start = ends[0] - col("step_s")[0]
        try:
            first_start = float(rows[warmup - 1]["end_unix_s"]) if warmup > 0 else first_start
        except (KeyError, TypeError, ValueError):
            pass
        window = (first_start, ends[-1])
    return {"steps": len(steady), "step_s": statistics.median(col("step_s")), "window_unix_s": window,
            "step_s_min": min(col("step_s")), "step_s_max": max(col("step_s")),
            "mem_gib": max(mem) if mem else None,
            "mem_by_rank": steady[-1].get("peak_mem_by_rank", ""),
            "optimizer_s": statistics.median(opt) if opt else None,
            "bubble_frac": statistics.median(bubble) if bubble else None}


def _err(pred: float | None, meas: float | None) -> str:
    if pred is None or meas is None or meas <= 0:
        return ""
    return f"{(pred - meas) / meas:+.1%}"


def _num(v: float | None, unit: str = "") -> str:
    return "-" if v is None else f"{v:.4g}{unit}"


@dataclass(frozen=True)
class Component:
    """A part of the traced step that is measured and predicted alike."""
    label: str
    predicted_keys: tuple[str, ...]
    """The cost model's breakdown_s keys it holds (planner/cost/step.py, predict)."""
    measured: str
    """The RankComponents attribute that measures it."""
    measured_text: str


COMPONENTS = (
    Component("GPU compute", ("compute", "recompute", "optimizer"), "compute_s", "non-NCCL kernels"),
    Component("exposed communication", ("tp_comm", "cp_comm", "ep_comm", "dp_comm", "pp_comm"),
              "exposed_communication_s", "NCCL kernels with no compute kernel beside them"),
    Component("GPU idle", ("bubble", "host"), "idle_s", "span - busy (pipeline bubble, host gaps, waits)"),
)


@dataclass(frozen=True)
class TracedStep:
    """The workers' --components-out record: one traced step, every rank's components."""
    step: int
    ranks: list[RankComponents]

    def compared_rank(self) -> RankComponents:
        """The rank with the largest span (then the most busy time): the one that sets the step's length."""
        return max(self.ranks, key=lambda r: (r.span_s, r.busy_s))

    def to_dict(self) -> dict:
        return {"step": self.step, "ranks": [r.to_dict() for r in self.ranks]}


def read_components(path: Path) -> TracedStep | str:
    """The traced step the workers wrote to `path`, or the sentence saying why there is none."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return "the run wrote no traced step"
    except (OSError, ValueError):
        return f"the traced step's file '{path.name}' could not be read"
    if not isinstance(data, dict):
        return f"the traced step's file '{path.name}' holds no record"
    if not data.get("traced"):
        return str(data.get("reason") or "not traced")
    try:
        ranks = [RankComponents.from_dict(d) for d in data["ranks"]]
        step = int(data["step"])
    except (KeyError, TypeError, ValueError):
        return f"the traced step's file '{path.name}' is malformed"
    return TracedStep(step, ranks) if ranks else "the traced step has no ranks"


def predicted_components_s(breakdown: dict) -> dict[str, float]:
    return {c.label: sum(breakdown.get(k, 0.0) for k in c.predicted_keys) for c in COMPONENTS}


def measured_components_s(rank: RankComponents) -> dict[str, float]:
    return {c.label: getattr(rank, c.measured) for c in COMPONENTS}


def _share(part: float, whole: float) -> str:
    return f"{part / whole:.1%}" if whole > 0 else "-"


def components_report(pred, traced: TracedStep | str | None, steady_step_s: float) -> list[str]:
    """The traced step's block of the report: measured components on the compared rank against the prediction's,
    in seconds and as fractions of the traced span / the predicted step. `traced`: a reason string when the
    step was not traced, None when it was not asked for (no lines)."""
    if traced is None:
        return []
    head = "components of one extra step, traced after the measured ones (torch.profiler, GPU kernels)"
    if isinstance(traced, str):
        return [f"{head}: {traced}"]
    rank = traced.compared_rank()
    if rank.span_s <= 0:
        return [f"{head}: the trace holds no GPU kernels"]
    lines = [f"{head}:",
             f"  traced step {traced.step}: span {rank.span_s:.4g} s on rank {rank.rank} (the largest of "
             f"{len(traced.ranks)} rank(s)); steady median step {steady_step_s:.4g} s "
             f"({_err(rank.span_s, steady_step_s) or '-'} traced against steady)",
             f"{'':<34}{'predicted':>12}{'measured':>12}{'error':>9}{'pred/step':>11}{'meas/span':>11}"]
    predicted, measured = predicted_components_s(pred.breakdown_s), measured_components_s(rank)
    for c in COMPONENTS:
        p, m = predicted[c.label], measured[c.label]
        lines.append(f"{'  ' + c.label:<34}{p:>12.4g}{m:>12.4g}{_err(p, m):>9}"
                     f"{_share(p, pred.step_s):>11}{_share(m, rank.span_s):>11}")
    for c in COMPONENTS:
        lines.append(f"    {c.label}: predicted {' + '.join(c.predicted_keys)}; measured {c.measured_text}")
    mapped = {k for c in COMPONENTS for k in c.predicted_keys}
    other = [f"{k} {v:.4g}" for k, v in pred.breakdown_s.items() if k not in mapped and v]
    if other:
        lines.append("    predicted but in no component: " + ", ".join(other))
    by_rank = sorted(traced.ranks, key=lambda r: r.rank)
    lines.append("  exposed communication per rank (s): "
                 + ", ".join(f"{r.rank}: {r.exposed_communication_s:.4g}" for r in by_rank))
    return lines


def report(plan: Plan, pred, meas: dict) -> str:
    b = pred.breakdown_s
    lines = [f"{plan.model.name} {plan.layout.short()} mb{plan.layout.micro_batch} sharding {plan.layout.sharding} "
             f"seq {plan.training.seq_len} global batch {plan.training.global_batch} recompute {recompute_text(plan.stages)}",
             f"steady state: median of {meas['steps']} steps (range {meas['step_s_min']:.4g}-{meas['step_s_max']:.4g} s)",
             f"{'':<34}{'predicted':>12}{'measured':>12}{'error':>9}",
             f"{'step time (s)':<34}{pred.step_s:>12.4g}{meas['step_s']:>12.4g}{_err(pred.step_s, meas['step_s']):>9}"]
    pmem = max(pred.memory_gib_per_rank)
    lines.append(f"{'peak memory, max over ranks (GiB)':<34}{pmem:>12.4g}{_num(meas['mem_gib']):>12}"
                 f"{_err(pmem, meas['mem_gib']):>9}")
    if meas["mem_by_rank"]:
        lines.append(f"  per rank measured: {meas['mem_by_rank'].replace(';', ', ')}; predicted per pipeline rank: "
                     + ", ".join(f"{m:.4g}" for m in pred.memory_gib_per_rank))
    lines.append("components (s, along the slowest pipeline rank):")
    timed = 0.0
    m_timed = 0.0
    if meas["optimizer_s"] is not None:
        lines.append(f"{'  optimizer (clip + AdamW)':<34}{b.get('optimizer', 0):>12.4g}{meas['optimizer_s']:>12.4g}"
                     f"{_err(b.get('optimizer', 0), meas['optimizer_s']):>9}")
        timed += b.get("optimizer", 0.0)
        m_timed += meas["optimizer_s"]
    if plan.layout.pp > 1 and meas["bubble_frac"] is not None:
        mb = meas["bubble_frac"] * meas["step_s"]
        lines.append(f"{'  pipeline bubble':<34}{b.get('bubble', 0):>12.4g}{mb:>12.4g}{_err(b.get('bubble', 0), mb):>9}")
        timed += b.get("bubble", 0.0)
        m_timed += mb
    rest_p, rest_m = pred.step_s - timed, meas["step_s"] - m_timed
    lines.append(f"{'  rest (compute + exposed comm)':<34}{rest_p:>12.4g}{rest_m:>12.4g}{_err(rest_p, rest_m):>9}")
    untimed = [k for k in b if k not in ("optimizer", "bubble") and b[k] > 0]
    if untimed:
        traced = isinstance(meas.get("components"), TracedStep)
        where = "timed apart in the traced step below" if traced else "not timed apart by the runtime"
        lines.append(f"    predicted split of the rest ({where}): " + ", ".join(f"{k} {b[k]:.4g}" for k in untimed))
    lines.extend(components_report(pred, meas.get("components"), meas["step_s"]))
    if host_paced(pred):
        lines.append(host_paced_note(pred))
    gpu_line = gpu_monitor.describe(meas.get("gpu_state"))
    if gpu_line:
        lines.append(gpu_line)
    return "\n".join(lines)


def result_row(plan: Plan, pred, meas: dict, gpu: str, profile_label: str) -> dict:
    lay = plan.layout
    return {"model": plan.model.name, "gpus": lay.world_size, "tp": lay.tp, "pp": lay.pp, "vpp": lay.vpp,
            "dp": lay.dp, "cp": lay.cp, "ep": lay.ep, "micro_batch": lay.micro_batch,
            "global_batch": plan.training.global_batch, "seq_len": plan.training.seq_len,
            "recompute": recompute_text(plan.stages),
            "predicted_step_s": f"{pred.step_s:.6g}", "measured_step_s": f"{meas['step_s']:.6g}",
            "predicted_mem_gib": f"{max(pred.memory_gib_per_rank):.6g}",
            "measured_mem_gib": f"{meas['mem_gib']:.6g}" if meas["mem_gib"] is not None else "",
            "gpu": gpu, "profile": profile_label, "commit": commit_label(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def profile_label(profile_arg: str | None, gpu: str) -> str:
    """The results CSV's `profile` column: the --profile given, or 'shipped:<stem>' of the shipped file actually
    read (the calibrated one where it ships, e.g. shipped:h200-sxm-calibrated; planner.profile.load_profile)."""
    from planner.profile import default_profile_path, resolve_profile_path

    if profile_arg is None:
        return f"shipped:{default_profile_path(gpu).stem}"
    used = resolve_profile_path(profile_arg)
    return f"shipped:{used.stem}" if used != Path(profile_arg) else profile_arg


def append_row(path: Path, row: dict, plan: Plan, gpu_state: dict | None = None,
               components: TracedStep | None = None) -> int:
    """Append the row (header first when the file is new) and its plan to the sidecar, with the GPUs' clock and
    power during the measured steps where they were sampled (runtime/gpu_monitor.py) and the traced step's
    per-rank components where it was traced; returns the row number."""
    n = _check_results_file(path) + 1
    new = not path.exists()
    if new:
        path.parent.mkdir(parents=True, exist_ok=True)
    else:
        with open(path, "rb+") as fh:  # a last line without its newline: the row goes on a line of its own
            fh.seek(-1, os.SEEK_END)
            if fh.read(1) not in (b"\n", b"\r"):
                fh.write(b"\n")
    with open(path, "a", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=RESULT_COLUMNS)
        if new:
            w.writeheader()
        w.writerow(row)
    with open(sidecar_path(path), "a") as fh:
        rec = {"row": n, "plan": plan.to_dict()}
        if gpu_state:
            rec["gpu_state"] = gpu_state
        if components is not None:
            rec["components"] = components.to_dict()
        fh.write(json.dumps(rec) + "\n")
    return n


def _run_plans(args, files: list[Path], out: Path) -> dict[str, str]:
    """Run plan files of one world size in as few torchruns as failures allow. Returns stem -> failure
    sentence for the plans that did not finish (their per-step CSVs, if any, are ignored)."""
    from runtime import launch

    failed: dict[str, str] = {}
    remaining = list(files)
    while remaining:
        largs = launch.build_parser().parse_args([str(remaining[0]), "--steps", str(args.steps), "--device",
                                                  args.device, "--data", args.data, "--results", str(out)])
        _, nproc = launch.check_plan_on_machine(largs)
        many = len(files) > 1
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
        _check_results_file(append)  # refuse a foreign file before spending the run
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
                    row = result_row(plan, pred, meas, _gpu_name(args.device), label)
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
