"""`plan profile --model NAME --base PROFILE`: time one model's GEMMs (and its attention, where the profile has
not measured its head dimension) on this GPU and add them to a profile.

A plan whose layer GEMMs fall between a profile's measured points reads interpolated times, and between the
grid's lines cuBLAS runs some shapes 10-25% off the interpolated rate, repeatably (2560 x 2560 x 8192 weight
gradients, for instance; benchmarks/results/README.md). The planner says so in every such plan's
provenance. Measuring a whole new profile to fix that takes five minutes and loses what the base profile holds
that a fresh one does not: the calibration `plan calibrate` fitted on measured runs, host figures from another
host, collectives from a two-GPU node. This times only the GEMMs of the models asked for that the base has
not measured (shapes.model_gemm_shapes: every TP degree, micro-batch 1-16, CP 1-8), in the profiler's own way
(warm-up, median of repeats, at the power cap if the base was timed there), adds them to the base's tables and
records in the provenance what was added, on which machine, when and at which commit. Nothing else changes.
"""
from __future__ import annotations

import copy
import time
from dataclasses import replace

import torch

from planner.errors import PlanError
from planner.profile import Profile
from runtime.profiler import environment, kernels, shapes
from planner.profile import ATTENTION_POINT_KEYS
from runtime.profiler.build import ATTENTION_REPS, Options, Reporter, gemm_devices, resolve_device
from runtime.profiler.gemm_workers import time_gemms_parallel
from runtime.profiler.timing import at_power_cap

ADDED_KEY = "added_gemms"
"""Provenance key: one record per extension (models, shapes added, machine, date, commit)."""


def missing_shapes(base: Profile, models, tp_degrees, flops_cap: float) -> tuple[list[shapes.GemmShape], int]:
    """(the models' GEMMs that the base has not measured, how many GEMMs the models run in all)."""
    wanted: dict[tuple, shapes.GemmShape] = {}
    for spec in models:
        for g in shapes.model_gemm_shapes(spec, spec.default_seq_len, tp_degrees, flops_cap=flops_cap):
            wanted.setdefault(g.key, g)
    todo = [g for g in wanted.values() if not base.gemm_measured(g.table, g.m, g.n, g.k)]
    return todo, len(wanted)


def missing_attention(base: Profile, models, device_type: str) -> list[dict]:
    """Attention grid points (shapes.attention_grid) for each model's head dimension and mask where the base has
    none: the planner otherwise prices it as the next larger head dimension measured (Profile.attention_kernel_
    head_dim), right where the kernel pads to that one's tile and a guess elsewhere."""
    out: dict[tuple, dict] = {}
    for spec in models:
        if base.attention_measured(spec.head_dim, spec.causal):
            continue
        for p in shapes.attention_grid(device_type, False, [spec.head_dim], spec.max_seq_len, (spec.causal,)):
            out.setdefault((p["seq"], p["head_dim"], p["causal"]), p)
    return list(out.values())


def extend_profile(base: Profile, opts: Options, reporter: Reporter | None = None) -> Profile:
    """The base with the GEMMs and attention of opts.models that it lacks timed here and added; raises PlanError
    for a base measured on another GPU kind, or when no model was asked for."""
    rep = reporter or Reporter()
    if not opts.models:
        raise PlanError("--base adds a model's GEMMs to a profile: name the model with --model")
    device, world, kind = resolve_device(opts)
    if base.gpu != kind:
        raise PlanError(f"the base profile was measured on {base.gpu} and this device is {kind}: its GEMMs would "
                        f"not compare; profile this GPU in full with `plan profile` instead")
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(1)
    grid_spec = shapes.gpu_grid_spec(False) if cuda else shapes.cpu_grid_spec(False)
    flops_cap = float(base.extras.get("gemm_grid", {}).get("flops_cap", grid_spec.flops_cap))
    todo, wanted = missing_shapes(base, opts.models, grid_spec.tp_degrees, flops_cap)
    names = [spec.name for spec in opts.models]
    budget = opts.budget_s or (270.0 if cuda else 120.0)
    t0 = time.monotonic()
    points, spreads, skipped = [], [], 0
    cap = cuda and base.kernels_timed_at_power_cap   # as the base was timed, or they would not compare
    if todo:
        rep.stage(f"GEMMs of {', '.join(names)} ({len(todo)} of {wanted} not in the base)", len(todo))
        reps = dict(warmup=2, repeats=7) if cuda else dict(warmup=1, repeats=3)
        with at_power_cap(device, cap):
            if cuda:
                torch.cuda.empty_cache()
            points, spreads, skipped = time_gemms_parallel(todo, gemm_devices(device, world),
                                                           deadline=t0 + budget, progress=rep.advance,
                                                           at_power_cap=cap, **reps)
    attention_todo = missing_attention(base, opts.models, device.type)
    attention = []
    if attention_todo:
        rep.stage(f"attention at head dimension {', '.join(sorted({str(p['head_dim']) for p in attention_todo}))} "
                  f"({len(attention_todo)} points)", len(attention_todo))
        with at_power_cap(device, cap):
            for p in attention_todo:
                r = kernels.time_attention(**p, device=device, **ATTENTION_REPS[device.type])
                attention.append({k: r[k] for k in ATTENTION_POINT_KEYS})
                rep.advance()
    tables = {"mm": list(base.gemm_points), "wgrad": list(base.wgrad_points), "fp8": list(base.fp8_points)}
    added = {"mm": 0, "wgrad": 0, "fp8": 0}
    for m, n, k, t, knd in points:
        name = shapes.GemmShape(m, n, k, knd).table
        tables[name].append((m, n, k, t))
        added[name] += 1
    where = environment.describe(device, world)
    record = {"models": names, "shapes_wanted": wanted, "already_measured": wanted - len(todo),
              "added": added, "attention_added": [[p["seq"], p["head_dim"], p["causal"]] for p in attention],
              "skipped_by_budget": skipped, "at_power_cap": cap,
              "wall_s": round(time.monotonic() - t0, 1),
              "median_spread": sorted(spreads)[len(spreads) // 2] if spreads else None,
              "how": "runtime/profiler/extend.py: each model's GEMMs (every TP degree it allows, micro-batch 1-16, "
                     "CP 1-8 at its default sequence; forward, dgrad, wgrad) that the base had not measured, timed "
                     "as the profiler times its grid (warm-up, median of repeats, device time)",
              **{k: where.get(k) for k in ("date", "gpu_name", "driver", "cuda", "torch", "hostname", "git_commit",
                                           "git_dirty") if k in where}}
    prov = copy.deepcopy(base.provenance)
    prov.setdefault(ADDED_KEY, []).append(record)
    prov.setdefault("parts", []).append(
        {"part": f"gemm (added: {', '.join(names)})", "status": "measured",
         "how": f"{sum(added.values())} GEMM shapes and {len(attention)} attention points timed on "
                f"{where.get('gpu_name')} on {where.get('date')} and added to this profile's tables "
                f"(provenance.{ADDED_KEY})"})
    extras = copy.deepcopy(base.extras)
    return replace(base, provenance=prov, extras=extras, gemm_points=tables["mm"], wgrad_points=tables["wgrad"],
                   fp8_points=tables["fp8"], attention_points=list(base.attention_points) + attention,
                   source_path="")
