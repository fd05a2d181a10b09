"""Time the MoE experts' grouped GEMMs against dense GEMMs of all their rows, and add them to a profile.

    python -m runtime.profiler.grouped --profile profiles/h200-sxm.json --out /tmp/h200.json \
        [--model NAME_OR_CONFIG ...] [--shape EXPERTS,N,K ...] [--device cuda|cpu]
    python -m runtime.profiler.grouped --profile profiles/h100-sxm.json --out /tmp/h100.json --copy-from MEASURED

The runtime runs a rank's local experts as one torch._grouped_mm per projection and direction
(runtime/parallel/expert_mlp.py): forward x W_g^T, dgrad dy W_g, and the weight gradient accumulated into the
experts' fp32 main gradients (runtime/grouped_wgrad.py where Triton runs, else a grouped GEMM and an add, as the
runtime falls back). Each is timed here in exactly that call, beside the dense GEMM of all its rows in the
runtime's own dense layouts (F.linear, dy @ W, the fp32-accumulating weight gradient), at the same clock (at the
power cap where the base profile's kernels were timed there). The planner reads their ratio
(planner/profile/grouped.py) at the rows per expert a layout gives and multiplies the base profile's dense GEMM.

Grid: for every expert weight shape (each MoE model's fc1 [gate|up, hidden] and fc2 [hidden, ffn], plus --shape),
expert counts E/ep for ep 1, 4, 16, 64 (while the experts' weights and fp32 gradients fit the memory cap), and
rows per expert 16 to 8192 by factors of four (CPU: a few small ones). --copy-from puts the points measured in
another profile into this one, labelled derived: a ratio of two GEMMs on one GPU, which the derived profile's own
dense GEMMs then scale.
"""
from __future__ import annotations

import argparse
import copy
import os
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from planner.errors import PlanError
from planner.model import ModelSpec
from planner.profile import Profile
from planner.profile.grouped import GroupedGemmPoint
from runtime import grouped_wgrad
from runtime.parallel.tensor import _accumulate_mm_
from runtime.profiler import environment
from runtime.profiler.kernels import compute_dtype
from runtime.profiler.timing import at_power_cap, time_fn

PART = "grouped_gemm"
EP_DEGREES = (1, 4, 16, 64)


@dataclass(frozen=True)
class GridSpec:
    rows: tuple[int, ...]
    """Rows per expert."""
    max_weight_bytes: int
    """Cap on one call's expert weights, bf16 plus their fp32 main gradients (6 bytes per parameter)."""
    max_rows_total: int
    """Cap on experts x rows."""


GPU_GRID = GridSpec(rows=(16, 64, 256, 1024, 4096, 8192), max_weight_bytes=12 << 30, max_rows_total=1 << 18)
CPU_GRID = GridSpec(rows=(4, 16, 64), max_weight_bytes=64 << 20, max_rows_total=1 << 12)


def expert_shapes(spec: ModelSpec) -> list[tuple[int, int, int]]:
    """(experts, n, k) of an MoE model's two expert projections: fc1 [(2 if gated) x ffn, hidden], fc2
    [hidden, ffn] (the [n, k] weights runtime/parallel/expert_mlp.py groups)."""
    if not spec.is_moe:
        raise PlanError(f"model '{spec.name}' has no experts")
    f, h = spec.ffn_hidden, spec.hidden
    return [(spec.num_experts, (2 if spec.gated_mlp else 1) * f, h), (spec.num_experts, h, f)]


def grid(shapes: list[tuple[int, int, int]], spec: GridSpec) -> list[tuple[int, int, int, int]]:
    """(experts in the call, rows per expert, n, k), deduplicated, in order."""
    out: dict[tuple, None] = {}
    for experts, n, k in shapes:
        for ep in EP_DEGREES:
            if experts % ep or (ep > 1 and experts // ep < 1):
                continue
            g = experts // ep
            if 6 * g * n * k > spec.max_weight_bytes:
                continue
            for m in spec.rows:
                if g * m <= spec.max_rows_total:
                    out[(g, m, n, k)] = None
    return list(out)


def _calls(g: int, m: int, n: int, k: int, device, dtype):
    """{direction: (grouped call, dense call)}, each fn(i), on operands made once."""
    rows = g * m
    x = torch.randn(rows, k, device=device, dtype=dtype)
    dy = torch.randn(rows, n, device=device, dtype=dtype)
    w = torch.randn(g, n, k, device=device, dtype=dtype) * 0.02
    main_grad = torch.zeros(g, n, k, device=device, dtype=torch.float32)
    offs = torch.arange(1, g + 1, device=device, dtype=torch.int32) * m
    w2d = w[0]
    dense_grad = torch.zeros(n, k, device=device, dtype=torch.float32)
    fast_wgrad = grouped_wgrad.supported(main_grad, dy, x)

    def grouped_wgrad_call(i):
        if fast_wgrad:
            grouped_wgrad.grouped_wgrad_(main_grad, dy, x, offs, False)
        else:  # the runtime's fallback: a bf16 grouped GEMM, then added into the main gradient
            main_grad.add_(torch._grouped_mm(dy.t(), x, offs=offs))

    return {
        "fwd": (lambda i: torch._grouped_mm(x, w.transpose(1, 2), offs=offs), lambda i: F.linear(x, w2d)),
        "dgrad": (lambda i: torch._grouped_mm(dy, w, offs=offs), lambda i: torch.matmul(dy, w2d)),
        "wgrad": (grouped_wgrad_call, lambda i: _accumulate_mm_(dense_grad, dy.t(), x)),
    }


def measure(shapes: list[tuple[int, int, int]], device: torch.device, at_cap: bool, progress=None,
            grid_spec: GridSpec | None = None, deadline: float | None = None) -> list[GroupedGemmPoint]:
    """Every grid point's three directions, grouped and dense, until `deadline` (time.monotonic()) if given."""
    cuda = device.type == "cuda"
    spec = grid_spec or (GPU_GRID if cuda else CPU_GRID)
    dtype = compute_dtype(device)
    reps = dict(warmup=3, repeats=7) if cuda else dict(warmup=1, repeats=3)
    points = []
    with at_power_cap(device, at_cap and cuda):
        for g, m, n, k in grid(shapes, spec):
            if deadline is not None and time.monotonic() > deadline:
                break
            calls = _calls(g, m, n, k, device, dtype)
            for direction, (grouped, dense) in calls.items():
                tg = time_fn(grouped, device, **reps).median_s
                td = time_fn(dense, device, **reps).median_s
                points.append(GroupedGemmPoint(direction, g, m, n, k, tg, td))
            del calls
            if cuda:
                torch.cuda.empty_cache()
            if progress:
                progress(g, m, n, k, points[-3:])
    return points


def part_record(points, names: list[str], at_cap: bool, seconds: float, where: dict) -> dict:
    """The provenance part of measured grouped GEMMs."""
    return {"part": PART, "status": "measured", "at_power_cap": at_cap,
            "how": f"torch._grouped_mm (fwd, dgrad) and the experts' fp32 weight gradient as "
                   f"runtime/parallel/expert_mlp.py runs them, {len(points)} points over expert counts, rows per "
                   f"expert and the expert weight shapes of {', '.join(names) or 'none'}, each beside the dense GEMM "
                   f"of all its rows (median of repeats, device time; runtime/profiler/grouped.py)",
            "seconds": round(seconds, 1),
            **{k: where.get(k) for k in ("date", "gpu_name", "driver", "cuda", "torch", "git_commit")}}


def _with_points(base: Profile, points: list[GroupedGemmPoint], part: dict) -> Profile:
    """base with these grouped GEMMs, its provenance's grouped part replaced by `part`."""
    prov = copy.deepcopy(base.provenance)
    prov["parts"] = [p for p in prov.get("parts", []) if p.get("part") != PART] + [part]
    return replace(base, provenance=prov, grouped_points=list(points), source_path="")


def copied_from(base: Profile, src: Profile, src_name: str = "") -> Profile:
    """base with the grouped GEMMs of src (named src_name in the provenance, default its file relative to the working
    folder), labelled derived: a ratio of two GEMMs on one GPU, which base's own dense GEMMs then scale. Where src's
    own points were copied, its record (which names the measured origin) is carried as it is."""
    src_name = src_name or (os.path.relpath(src.source_path) if src.source_path else src.gpu)
    if not src.grouped_points:
        raise PlanError(f"'{src_name}' has no grouped GEMMs to copy")
    record = next((p for p in reversed(src.provenance.get("parts", [])) if p.get("part") == PART), {})
    if record.get("status") == "derived":
        return _with_points(base, src.grouped_points, dict(record))
    return _with_points(base, src.grouped_points, {
        "part": PART, "status": "derived",
        "how": f"{len(src.grouped_points)} grouped-over-dense GEMM ratios copied from {src_name} "
               f"({src.gpu}, measured {record.get('date', '?')} at {record.get('git_commit', '?')}): "
               f"a ratio of two GEMMs on one GPU, applied to this profile's own dense GEMMs "
               f"(python -m runtime.profiler.grouped --copy-from)"})


def _parse_shape(text: str) -> tuple[int, int, int]:
    try:
        e, n, k = (int(v) for v in text.split(","))
    except ValueError:
        raise PlanError(f"--shape '{text}' is not EXPERTS,N,K (three whole numbers)") from None
    if min(e, n, k) < 1:
        raise PlanError(f"--shape '{text}' needs three numbers >= 1")
    return e, n, k


def _load(path: str) -> Profile:
    from planner.profile import resolve_profile_path
    return Profile.load(resolve_profile_path(path))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m runtime.profiler.grouped", description=__doc__.splitlines()[0])
    ap.add_argument("--profile", required=True, help="profile to add the grouped GEMMs to")
    ap.add_argument("--out", required=True, help="the profile to write (must not exist)")
    ap.add_argument("--model", action="append", default=[],
                    help="MoE model (catalogue name or Hugging Face config) whose experts to time; default: every "
                         "MoE model of the catalogue")
    ap.add_argument("--shape", action="append", default=[], help="EXPERTS,N,K of an expert weight [N, K] to time too")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--copy-from", default=None,
                    help="copy the grouped GEMMs measured in this profile instead of timing (labelled derived)")
    args = ap.parse_args(argv)
    try:
        if Path(args.out).exists():
            raise PlanError(f"'{args.out}' already exists")
        base = _load(args.profile)
        if args.copy_from:
            out = copied_from(base, _load(args.copy_from), args.copy_from)
        else:
            from planner.model.catalogue import CATALOGUE, resolve_model
            specs = [resolve_model(m) for m in args.model] or [s for s in CATALOGUE.values() if s.is_moe]
            shapes = [s for spec in specs for s in expert_shapes(spec)] + [_parse_shape(s) for s in args.shape]
            device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
            if device.type == "cuda":
                if not torch.cuda.is_available():
                    raise PlanError("no CUDA GPU is visible; pass --device cpu")
                torch.cuda.set_device(device)
            else:
                torch.set_num_threads(1)
            cap = device.type == "cuda" and base.kernels_timed_at_power_cap
            t0 = time.time()

            def say(g, m, n, k, pts):
                print(f"G={g:4d} M={m:5d} [{n}x{k}]: " + ", ".join(f"{p.direction} {p.ratio:.2f}" for p in pts),
                      file=sys.stderr, flush=True)
            points = measure(shapes, device, cap, progress=say)
            names = [spec.name for spec in specs] + [f"[{n}x{k}] x{e}" for e, n, k in map(_parse_shape, args.shape)]
            out = _with_points(base, points, part_record(points, names, cap, time.time() - t0,
                                                         environment.describe(device, 1)))
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        out.save(Path(args.out))
        Profile.load(Path(args.out))  # what was written reads back
    except PlanError as exc:
        print(f"grouped: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}: {len(out.grouped_points)} grouped GEMM points", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
