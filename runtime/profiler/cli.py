"""`plan profile [--out FILE] [--quick] [--gpus N] [--device cpu|cuda] [--model NAME [--base PROFILE]]`: measure
this machine, write a profile; with --base, time only the model's GEMMs that profile lacks and add them to it
(runtime/profiler/extend.py).

`main(argv)` returns the exit code; bad input gets one sentence on stderr and a non-zero code.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from planner.errors import PlanError


def parser() -> argparse.ArgumentParser:
    from planner.arguments import Parser  # argparse errors as one sentence, exit 1
    from planner.limits import MAX_GPUS_PER_NODE, MAX_NETWORK_GB_PER_S, MAX_SECONDS, float_arg, int_arg

    p = Parser(prog="plan profile", description="Time this machine's kernels and collectives "
                                "(the ones the runtime runs) and write a profile the planner reads.")
    p.add_argument("--out", "-o", help="profile file to write (default: profile-<gpu kind>.json)")
    p.add_argument("--quick", action="store_true", help="coarser grids: under a minute on one GPU node")
    p.add_argument("--gpus", type=int_arg("--gpus", 1, MAX_GPUS_PER_NODE), default=None,
                   help="GPUs (processes on CPU) for the collectives; default all visible (2 on CPU)")
    p.add_argument("--device", choices=("cuda", "cpu"), default=None,
                   help="cuda (default when a GPU is visible) or cpu (gloo, tiny sizes, for tests)")
    p.add_argument("--force", action="store_true", help="overwrite an existing output file")
    p.add_argument("--gpu-kind", help="GPU kind to record (default: from the device name; another known kind than "
                   "the device's is refused)")
    p.add_argument("--budget", type=float_arg("--budget", 0.0, MAX_SECONDS), default=None, help="wall-clock budget in seconds (default 270, quick 50)")
    p.add_argument("--nic-gbps", type=float_arg("--nic-gbps", 0.0, MAX_NETWORK_GB_PER_S), default=None,
                   help="modelled network bandwidth per GPU in GB/s (default 50: 400 Gb/s NDR InfiniBand), for GPU kinds outside planner/profile/physics.py; those it knows are modelled at its nominal NIC and the planner scales them to --inter-node-gbps")
    p.add_argument("--nic-latency-us", type=float_arg("--nic-latency-us", 0.0, MAX_SECONDS * 1e6, lo_open=False), default=None, help="modelled network latency per hop (default 10)")
    p.add_argument("--model", action="append", default=[], metavar="NAME",
                   help="also time every GEMM this model's plans can run, before the catalogue grid (a catalogue "
                        "name or a Hugging Face config.json; repeat or comma-separate for several)")
    p.add_argument("--base", metavar="PROFILE",
                   help="with --model: time only that model's GEMMs that this profile (a file, or a shipped name such "
                        "as h200-sxm-calibrated) has not measured, and write it with them added; the rest of it, "
                        "calibration included, is kept (a minute or two on one GPU, against five for a full profile)")
    p.add_argument("--burst", action="store_true",
                   help="time kernels in short bursts at whatever clock the GPU is at, not held at its power cap "
                        "where sustained training runs (the default; see runtime/profiler/timing.py)")
    p.add_argument("--no-host", action="store_true",
                   help="leave out the host-time stage (about two minutes on a GPU): the profile then has no host "
                        "floor unless one is composed in (benchmarks/compose_profile.py --host-from)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


class _RichReporter:
    def __init__(self, progress):
        self.progress = progress
        self.task = None
        self.total = 0

    def stage(self, name, total):
        if self.task is not None:   # a stage may finish early (time budget): show it complete
            self.progress.update(self.task, completed=self.total)
        self.total = max(total, 1)
        self.task = self.progress.add_task(name, total=self.total)

    def advance(self, n=1):
        if self.task is not None:
            self.progress.advance(self.task, n)


def run(args: argparse.Namespace) -> Path:
    """Measures and writes the profile; raises PlanError for bad input."""
    from planner.outputs import check_output_file
    from runtime.profiler.build import Options, build_profile, resolve_device

    device = args.device
    if device is None:
        import torch
        device = "cuda" if torch.cuda.is_available() else "cpu"
    from planner.model import resolve_model
    models = tuple(resolve_model(name.strip()) for arg in args.model for name in arg.split(",") if name.strip())
    opts = Options(device=device, gpus=args.gpus, quick=args.quick, gpu_kind=args.gpu_kind, budget_s=args.budget,
                   models=models, at_power_cap=not args.burst,
                   host=not args.no_host)
    if args.nic_gbps is not None:
        if args.nic_gbps <= 0:
            raise PlanError(f"--nic-gbps must be positive, got {args.nic_gbps}")
        opts.nic_gb_per_s = args.nic_gbps
    if args.nic_latency_us is not None:
        if args.nic_latency_us < 0:
            raise PlanError(f"--nic-latency-us must not be negative, got {args.nic_latency_us}")
        opts.nic_latency_us = args.nic_latency_us
    if args.budget is not None and args.budget <= 0:
        raise PlanError(f"--budget must be positive, got {args.budget}")
    _, _, kind = resolve_device(opts)   # validates device and --gpus before anything is measured
    base = None
    if args.base:
        from planner.profile import Profile, resolve_profile_path
        from runtime.profiler.extend import extend_profile
        if not models:
            raise PlanError("--base adds a model's GEMMs to a profile: name the model with --model")
        base = Profile.load(resolve_profile_path(args.base))
        default_out = f"profile-{kind}-{'-'.join(m.name for m in models)}.json"
    else:
        default_out = f"profile-{kind}.json"
    out = Path(args.out) if args.out else Path(default_out)
    check_output_file(out, "--out", overwrite=args.force)   # before minutes of measuring, not after

    def measure(reporter=None):
        return extend_profile(base, opts, reporter) if base is not None else build_profile(opts, reporter)

    if args.no_progress:
        prof = measure()
    else:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
        with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), transient=False) as progress:
            prof = measure(_RichReporter(progress))

    # write atomically, then check that what was written loads
    fd, tmp = tempfile.mkstemp(prefix=".profile-", suffix=".json", dir=str(out.parent))
    os.close(fd)
    try:
        prof.save(Path(tmp))
        from planner.profile import Profile
        Profile.load(Path(tmp))
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    if base is not None:
        _added_summary(prof, out)
    else:
        _summary(prof, out)
    return out


def _added_summary(prof, out: Path) -> None:
    from runtime.profiler.extend import ADDED_KEY
    r = prof.provenance[ADDED_KEY][-1]
    added = sum(r["added"].values())
    att = r["attention_added"]
    print(f"wrote {out}: {added} GEMM shapes of {', '.join(r['models'])} added ({r['already_measured']} of its "
          f"{r['shapes_wanted']} were measured in the base already"
          + (f"; {r['skipped_by_budget']} left out by the time budget" if r["skipped_by_budget"] else "")
          + ")" + (f" and {len(att)} attention points at head dimension "
                   f"{', '.join(sorted({str(p[1]) for p in att}))}" if att else "")
          + f" in {r['wall_s']} s on {r.get('gpu_name')}")


def _summary(prof, out: Path) -> None:
    pv = prof.provenance
    lines = [f"wrote {out}: {prof.gpu} ({pv.get('gpu_name')}, {pv.get('gpus_used')} used) in {pv.get('wall_s')} s",
             f"  GEMM: {len(prof.gemm_points)} shapes (+ {len(prof.wgrad_points)} weight-gradient), best "
             f"{prof.peak_gemm_flops / 1e12:.1f} TFLOP/s",
             f"  attention: {len(prof.attention_points)} points, best fwd "
             f"{max(p['fwd_tflops'] for p in prof.attention_points):.1f} / bwd "
             f"{max(p['bwd_tflops'] for p in prof.attention_points):.1f} TFLOP/s",
             f"  copy {prof.copy_bandwidth_bytes_per_s / 1e9:.1f} GB/s, elementwise efficiency "
             f"{prof.elementwise_efficiency:.2f}, AdamW {prof.optimizer_s_per_param * 1e12:.2f} ps/param, "
             f"launch {prof.kernel_launch_s * 1e6:.1f} us"]
    for c in prof.collectives:
        if c.measured:
            lines.append(f"  {c.op:<15} {c.link}/{c.group_size}: {c.latency_s * 1e6:7.1f} us + "
                         f"busbw {c.bus_bandwidth_bytes_per_s / 1e9:7.1f} GB/s")
    modelled = sorted({f"{c.link}/{c.group_size}" for c in prof.collectives if not c.measured},
                      key=lambda s: (s.split("/")[0], int(s.split("/")[1])))
    if modelled:
        lines.append(f"  modelled collective groups: {', '.join(modelled[:6])}{' ...' if len(modelled) > 6 else ''}")
    bad = prof.host.recompute_order_violations() if prof.host is not None else []
    if bad:
        lines.append("  warning: host time per layer is not ordered none <= selective <= full (probe noise; the "
                     "planner will misjudge recompute where the host paces the step; re-run the probe with "
                     "python -m runtime.profiler.host): " + "; ".join(bad))
    print("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    try:
        args = parser().parse_args(argv)
        run(args)
    except PlanError as exc:
        print(f"plan: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("plan: interrupted; no profile written", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
