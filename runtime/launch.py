"""`plan launch plan.json ...`: check everything that can be checked on this machine, then start torchrun.

Checks (each failure is one sentence and a non-zero exit, before any GPU work): --steps is at least 1; the
plan loads and is legal; its model is not a Hugging Face type the runtime only approximates (phi, gpt_neox, falcon,
starcoder2, opt: planner/hf_checks.py APPROXIMATED_TYPES); its world size equals nproc-per-node x nnodes, and on
several nodes every tensor-parallel group lies inside one node; CUDA and enough GPUs are present for --device
cuda; the data source opens and is long enough; the results CSV's folder exists and the CSV does not (unless resuming);
--ckpt-dir is a folder, holding no checkpoint for a fresh run and a complete one for --resume.
Then runs `python -m torch.distributed.run ... -m runtime.train ...` (single node by default; several
nodes with --nnodes, --node-rank and --rdzv-endpoint) and returns its exit code. A worker that stops on bad
input reports its sentence through a file (WORKER_ERROR_FILE_ENV), printed here once in place of torchrun's
traceback; SIGTERM / SIGINT to this process go on to torchrun, whose workers stop after the current step and
save (`run_torchrun`). torchrun and its workers die with this process, and a dead or hung rank ends the job
within --timeout, in one sentence naming the rank, the step and the checkpoint to resume from
(runtime/supervise.py).
"""
from __future__ import annotations

import contextlib
import csv
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path

from planner.errors import PlanError
from planner.hf_checks import refuse_approximated_model_type
from planner.launch_command import WORKER_ERROR_FILE_ENV, build_parser, torchrun_command  # noqa: F401 (re-exported)
from planner.lr_schedule import from_args as optimizer_settings
from planner.plan import Plan
from runtime import supervise

FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def check(args) -> tuple[Plan, int, Path]:
    if args.steps < 1:
        raise PlanError(f"--steps must be at least 1, got {args.steps}")
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        raise PlanError(f"--timeout must be a number of seconds above 0, got {args.timeout}")
    if args.save_every < 0:
        raise PlanError(f"--save-every must be 0 (only at exit) or more, got {args.save_every}")
    settings = optimizer_settings(args)  # the learning-rate schedule and optimizer options, one sentence if bad
    plan, nproc = check_plan_on_machine(args)
    results = Path(args.results) if args.results else Path(args.plan).with_suffix(".results.csv")
    check_results_file(results, args.resume)
    if args.resume and not args.ckpt_dir:
        raise PlanError("--resume needs --ckpt-dir")
    if args.override_lr_schedule and not args.resume:
        raise PlanError("--override-lr-schedule needs --resume")
    if args.save_every and not args.ckpt_dir:
        raise PlanError("--save-every needs --ckpt-dir")
    if args.ckpt_dir:
        from runtime.checkpoint import check_dir
        check_dir(args.ckpt_dir, args.resume, settings, args.override_lr_schedule,
                  report=lambda note: print(f"plan: {note}", file=sys.stderr, flush=True))
    check_memory_trace(args, nproc)
    if args.init_from or args.save_hf or args.hf_config:
        from runtime.hf.checks import check_launch_folders
        check_launch_folders(plan.model, args.init_from, args.save_hf, args.hf_config, args.save_every,
                             plan.layout.tp)
    return plan, nproc, results


def check_results_file(results: Path, resume: bool) -> None:
    """The step CSV can be written where asked, a fresh run does not append to an earlier run's, and a resumed
    one appends only to a step CSV of ours (an empty file counts as new). Writability is found by doing: a probe
    file is created and removed in its folder (os.access says "writable" to root in /proc); a device, FIFO or
    symbolic link is refused (the worker would write through it)."""
    from planner.outputs import probe_folder

    if results.is_symlink():
        raise PlanError(f"results file '{results}' is a symbolic link; give the file itself or another --results")
    if results.is_dir():
        raise PlanError(f"results file '{results}' is a folder")
    if results.exists() and not results.is_file():
        raise PlanError(f"results file '{results}' is not a regular file")
    if not results.parent.is_dir():
        raise PlanError(f"the folder of results file '{results}' does not exist")
    if results.exists() and not resume:
        raise PlanError(f"results file '{results}' already exists; move it away or pass --results")
    if results.exists():
        if not os.access(results, os.W_OK):
            raise PlanError(f"results file '{results}' is not writable")
        if results.stat().st_size and not _is_step_csv(results):
            raise PlanError(f"results file '{results}' is not a step CSV of plan launch (its first line is not "
                            "our header); give another --results")
    probe_folder(results.parent, "--results", results)


def _is_step_csv(path: Path) -> bool:
    """A header of ours: 'step' and 'loss' and only columns the worker writes (an older run's subset too)."""
    from runtime.train import CSV_FIELDS
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            header = next(csv.reader(fh), [])
    except (OSError, UnicodeDecodeError, csv.Error):
        return False
    return {"step", "loss"} <= set(header) and set(header) <= set(CSV_FIELDS) and len(set(header)) == len(header)


def check_nodes(args, plan: Plan, nproc: int) -> None:
    """On several nodes, every tensor-parallel group inside one node: ranks are numbered TP fastest, node by
    node, so that holds when a node's process count is a multiple of tp (TP's per-layer collectives would
    otherwise cross the network)."""
    tp = plan.layout.tp
    if args.nnodes > 1 and nproc % tp:
        raise PlanError(f"{nproc} process(es) per node would split tensor-parallel groups of {tp} across nodes; "
                        f"the processes per node must be a multiple of tp {tp}")


def check_memory_trace(args, nproc: int) -> None:
    """--memory-step / --memory-out: CUDA only, a step the run reaches, and no file of it already there."""
    step, prefix = getattr(args, "memory_step", 0), getattr(args, "memory_out", None)
    if not step and not prefix:
        return
    if not step or not prefix:
        raise PlanError("--memory-step and --memory-out go together")
    if args.device != "cuda":
        raise PlanError("--memory-step records the CUDA allocator; it needs --device cuda")
    if not 1 <= step <= args.steps:
        raise PlanError(f"--memory-step {step} is not one of the run's steps 1..{args.steps}")
    taken = [f"{prefix}.rank{r}.json" for r in range(nproc * args.nnodes) if Path(f"{prefix}.rank{r}.json").exists()]
    if taken:
        raise PlanError(f"'{taken[0]}' already exists; give another --memory-out")


def check_plan_on_machine(args) -> tuple[Plan, int]:
    """The checks that do not concern output files: plan, world size, GPUs, data source."""
    plan = Plan.load(Path(args.plan))
    refuse_approximated_model_type(plan.model.hf_model_type)  # planned as GPT-style: trained so, another model
    world = plan.layout.world_size
    if args.nnodes < 1:
        raise PlanError(f"--nnodes must be at least 1, got {args.nnodes}")
    nproc = args.nproc_per_node if args.nproc_per_node is not None else world // args.nnodes
    if nproc < 1 or nproc * args.nnodes != world:
        raise PlanError(f"the plan needs {world} processes ({plan.layout.short()}) but the launch would start "
                        f"{max(nproc, 0) * args.nnodes} ({args.nnodes} node(s) x {max(nproc, 0)} per node)")
    check_nodes(args, plan, nproc)
    if args.device == "cuda":
        import torch
        if not torch.cuda.is_available():
            raise PlanError("--device cuda was asked for but this machine has no usable CUDA GPU "
                            "(use --device cpu for a CPU run)")
        if torch.cuda.device_count() < nproc:
            raise PlanError(f"the plan puts {nproc} processes on this node but it has "
                            f"{torch.cuda.device_count()} GPU(s)")
        if plan.layout.fp8:
            from runtime.parallel.fp8 import check_fp8_device
            for i in range(nproc):
                why = check_fp8_device(f"cuda:{i}")
                if why:
                    raise PlanError(why)
    from runtime.data import open_source
    open_source(args.data, plan.model.vocab_size, plan.training.seq_len, args.data_dtype)
    return plan, nproc


def main(argv=None) -> int:
    try:
        args = build_parser().parse_args(argv)  # a bad flag: one sentence (planner.arguments.Parser), exit 1
        plan, nproc, results = check(args)
        cmd = torchrun_command(args, nproc, results)
    except PlanError as exc:
        print(f"plan: {exc}", file=sys.stderr)
        return exc.exit_code
    if args.dry_run:
        from planner.shell_safe import shell_line
        print(shell_line(cmd))
        return 0
    ranks = range(args.node_rank * nproc, (args.node_rank + 1) * nproc)
    return run_torchrun(cmd, worker_env(args.device), args.ckpt_dir, ranks, args.timeout)


def run_torchrun(cmd: list[str], env: dict, ckpt_dir=None, ranks: range = range(0),
                 timeout_s: float = supervise.DEFAULT_TIMEOUT_S) -> int:
    """Run torchrun; returns the launch's exit code. A sentence a worker reported is printed once (the worker's
    exit code), and torchrun's traceback of that failed child is dropped. SIGTERM / SIGINT here are forwarded,
    and the stop is reported in one sentence (128 + the signal). The heartbeats of this node's `ranks` are
    watched (supervise.Monitor): a dead or hung rank, or torchrun killed, ends in one sentence (exit 1). Any
    other failure keeps torchrun's output."""
    with tempfile.TemporaryDirectory(prefix="plan-launch-") as tmp:
        error_file = Path(tmp) / "worker-error"
        beats = Path(tmp) / "heartbeat"
        beats.mkdir()
        env = {**env, WORKER_ERROR_FILE_ENV: str(error_file), supervise.HEARTBEAT_DIR_ENV: str(beats)}
        env, job = supervise.job_env(env)  # every process of the job carries its id: the monitor ends them all
        # torchrun in a session of its own: a terminal's Ctrl-C then reaches it once, through forward_signals,
        # not twice (a second signal cuts short torchrun's wait for its workers to save); killed when this
        # process dies (its workers then die with it), from the first instant
        proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True, errors="replace",
                                start_new_session=True, preexec_fn=supervise.preexec_bound_to(os.getpid()))
        with forward_signals(proc) as received, \
                supervise.Monitor(beats, ranks, timeout_s, proc, job_id=job) as monitor:
            held = relay_stderr(proc.stderr, lambda: error_file.exists() or bool(received) or bool(monitor.verdict),
                                delay_s=1.0 if ranks else 0.0, exited=lambda: proc.poll() is not None)
            rc = proc.wait()
        reported = _worker_error(error_file)
    killed = monitor.verdict is not None and monitor.verdict.kind == "died" and rc != 0 \
        and (supervise.root_cause("".join(held))[1] or 0) < 0
    if reported and not killed:  # a rank killed by a signal first: the others' errors (a broken save) follow from it
        code, sentence = reported
        print(f"plan: {sentence}", file=sys.stderr)
        return code
    if received:
        return _report_stop(received[0], held, ckpt_dir)
    text = "".join(held)
    verdict = monitor.verdict
    if verdict is not None and verdict.kind != "died" or rc < 0:
        sentence = (supervise.verdict_sentence(verdict, timeout_s, text, supervise.resume_from(ckpt_dir))
                    if verdict is not None and verdict.kind != "died"
                    else supervise.exited_sentence(rc, supervise.resume_from(ckpt_dir)))
        print(f"plan: {sentence}", file=sys.stderr)
        return 1
    if verdict is not None and rc != 0:
        rank, code = supervise.root_cause(text)
        if rank is not None:
            verdict.rank, verdict.step = rank, monitor.steps.get(rank, verdict.step)
        if code is None or code >= 0:  # a worker's own failure: its traceback matters
            sys.stderr.write(text)
        print(f"plan: {supervise.verdict_sentence(verdict, timeout_s, text, supervise.resume_from(ckpt_dir))}",
              file=sys.stderr)
        return 1
    sys.stderr.write(text)
    return rc


@contextlib.contextmanager
def forward_signals(proc: subprocess.Popen):
    """While torchrun runs, SIGTERM / SIGINT to this process go to it (it then signals its workers, which stop
    after the current step and save) instead of ending this process and orphaning it. Yields the signals seen."""
    received: list[int] = []

    def forward(signum, _frame):
        received.append(signum)
        proc.send_signal(signum)  # a no-op once torchrun has exited

    if threading.current_thread() is not threading.main_thread():  # handlers can only be set on the main thread
        yield received
        return
    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED_SIGNALS}
    try:
        yield received
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


EXITED_GRACE_S = 1.0
"""How long torchrun's stderr is still read after torchrun exited: a process it left behind holding the pipe
open (ended by the monitor's sweep) must not keep the launch waiting."""


def relay_stderr(stream, hold, delay_s: float = 0.0, exited=lambda: False) -> list[str]:
    """Copy torchrun's stderr (its own and its workers') to ours, each line `delay_s` after it came, until
    `hold()` is true: from then on lines are kept back, since what follows a reported error, a forwarded signal
    or a rank's death is torchrun's (and the other ranks') account of it; the delay gives the heartbeat monitor
    time to notice a death before the other ranks' tracebacks about it are shown. Reading stops at the stream's
    end, or EXITED_GRACE_S after `exited()` (torchrun has exited) turned true. Returns the lines kept back."""
    held: list[str] = []
    lines: deque = deque()
    reader = threading.Thread(target=lambda: [lines.append((time.monotonic(), ln)) for ln in stream], daemon=True)
    reader.start()
    exited_at = None
    while True:
        now = time.monotonic()
        if exited_at is None and exited():
            exited_at = now
        alive = reader.is_alive() and (exited_at is None or now - exited_at < EXITED_GRACE_S)
        now = time.monotonic()
        while lines and (not alive or lines[0][0] <= now - delay_s):
            line = lines.popleft()[1]
            if held or hold():
                held.append(line)
            else:
                sys.stderr.write(line)
                sys.stderr.flush()
        if not alive and not lines:
            return held
        reader.join(0.05)


def _worker_error(path: Path) -> tuple[int, str] | None:
    """(exit code, sentence) a worker wrote to the error file (train.report_error), or None."""
    try:
        code, sentence = path.read_text().split("\n", 1)
    except (OSError, ValueError):
        return None
    return (int(code) if code.isdigit() else 1), sentence.strip()


def _report_stop(signum: int, held: list[str], ckpt_dir) -> int:
    """After a forwarded signal: one sentence naming what was saved. torchrun's own account of the stop (one
    traceback of its SignalException) is dropped; anything else it printed (a worker's traceback, a worker
    killed for not stopping in time) is shown."""
    text = "".join(held)
    lines = [ln for ln in held if ln.strip()]
    routine = (text.count("Traceback (most recent call last)") == 1 and bool(lines)
               and "SignalException" in lines[-1] and "forcefully" not in text)
    if not routine:
        sys.stderr.write(text)
    name = signal.Signals(signum).name
    if not ckpt_dir:
        print(f"plan: stopped by {name}; nothing was saved (no --ckpt-dir)", file=sys.stderr)
    else:
        from runtime.checkpoint import complete_steps, step_dir
        steps = complete_steps(ckpt_dir)
        saved = f"the newest checkpoint is '{step_dir(ckpt_dir, steps[-1])}'" if steps else "no checkpoint was saved"
        print(f"plan: stopped by {name}; {saved}", file=sys.stderr)
    return 128 + signum


def worker_env(device: str) -> dict:
    """The environment torchrun's workers get: this repository importable, one OpenMP thread per CPU process."""
    from runtime.data import scanned_files_env
    env = {**os.environ, **scanned_files_env()}  # data files check() scanned are not scanned again per worker
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if device == "cpu":
        env.setdefault("OMP_NUM_THREADS", "1")
    return env


if __name__ == "__main__":
    sys.exit(main())
