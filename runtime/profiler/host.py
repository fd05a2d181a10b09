"""Host (CPU) time the runtime spends per layer and micro-batch: the floor under a step when kernels are short.

With small micro-batches the GPU finishes a layer's kernels faster than Python, autograd and the
communication calls can issue them; the step then runs at the host's pace, and NCCL kernels sit waiting
for a peer that has not launched yet. The kernel and collective times of the profile cannot see this, so
the profiler measures it: real training steps of this runtime (runtime.step / runtime.parallel.pipeline,
the same code `plan launch` runs) on models so narrow (hidden 256, 256 tokens) that every kernel is
shorter than its launch, in `world` spawned processes. Each figure is a difference of two depths
(2 and 6 layers), so per-step costs (optimizer, loss, data) cancel; the two depths are timed in alternating
rounds and the median over rounds is kept (ROUNDS), so that a transient cannot fall on one depth only:

  layer_s[mode]      per layer and micro-batch, recompute none / selective / full (DP2, the base),
                     for each model family that has its own host figures (family_layer_s: gpt, llama, bert;
                     layer_s is llama's); a family registered with host_figures_of is priced by the figures of
                     the family it names (planner/model/families.py)
  tp_extra_s[mode]   added by tensor parallelism (TP2; the op count does not grow with the TP degree)
  cp_extra_s         added per extra context-parallel rank (CP2 - base, scaled by cp - 1 in the planner)
  fsdp_extra_s       added by fully sharded data parallelism (per-layer gathers and reductions)
  expert_s           the MoE layer's extra host time over the dense layer (PROBE_EXPERTS = 8 experts, EP1)
                     / 8; the planner charges an MoE layer 8 x expert_s whatever its expert count (grouped
                     expert GEMMs: one kernel per projection) and, at EP > 1 only, adds it to the GPU time
                     (routing synchronises there)
  ep_extra_s         added by expert parallelism's all-to-alls (EP2 over the MoE layer at EP1)
  ends_s             per micro-batch outside the layers (embedding, head, loss; the step's own costs spread
                     over the probe's micro-batches), per family as family_ends_s
  pp_chunk_s         per pipeline chunk and micro-batch (sends, receives, schedule), from PP2 with 2 vs
                     1 chunks per rank
  family_single_rank_layer_s, family_single_rank_ends_s
                     recompute none and the ends, per family, in one more spawned process alone (no data
                     parallelism: no gradient hooks, no bucketed reductions); the planner charges plans
                     without a data-parallel group the DP2 figures minus the difference (when world > 1)

    python -m runtime.profiler.host --profile profiles/h200-sxm.json --out NEW.json   # measure, merge
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from planner.profile import PROBE_EXPERTS

DEPTHS = (2, 6)
MICRO_BATCHES = 8


def probed_families() -> tuple[str, ...]:
    """The families the probe measures: every registered one without host_figures_of (ModelFamily.
    measured_by_host_probe), in registration order (gpt, llama, bert)."""
    from planner.model.families import FAMILIES
    return tuple(name for name, fam in FAMILIES.items() if fam.measured_by_host_probe)


def _spec(layers: int, experts: int = 1, family: str = "llama"):
    """The probe model: the family's tiny model (its key/value heads and tying) widened to hidden 256."""
    from planner.model import tiny_model
    return tiny_model(family, name=f"host-probe-{family}", num_layers=layers, hidden=256, num_heads=4,
                      ffn_hidden=512, vocab_size=1024, max_seq_len=256, default_seq_len=256, num_experts=experts,
                      top_k=2 if experts > 1 else 1)


class _ProbeRun:
    """The probe model at one depth under `lay`, built once (every rank builds it); `step()` runs one training
    step of the runtime and returns its wall seconds on the slowest rank."""

    def __init__(self, lay, layers: int, recompute: str, device, experts: int = 1, family: str = "llama",
                 groups=None):
        import torch

        from planner.cluster import ClusterSpec
        from planner.plan import Plan, TrainingShape, even_stages
        from runtime.data import open_source
        from runtime.parallel.data_parallel import AdamConfig, build_optimizer
        from runtime.step import select_train_step
        from runtime.train import build_rank_stages

        self.lay, self.device = lay, device
        self.spec = _spec(layers, experts, family)
        self.shape = TrainingShape(seq_len=256, global_batch=MICRO_BATCHES * lay.dp)
        cluster = ClusterSpec(gpu="h200-sxm", num_gpus=lay.world_size, gpus_per_node=lay.world_size)
        plan = Plan(model=self.spec, cluster=cluster.to_dict(), training=self.shape, layout=lay,
                    stages=even_stages(layers, lay.pp * lay.vpp, recompute))
        self.groups = groups if groups is not None else _groups_for(lay, device.type)
        self.stages = build_rank_stages(plan, self.groups, device, lay.overlap_tp, 1234)
        self.opt = build_optimizer(self.stages, self.groups, lay.sharding, AdamConfig(),
                                   torch.bfloat16 if device.type == "cuda" else torch.float32, lay.overlap_dp)
        self.step_fn = select_train_step(lay)
        self.source = open_source("synthetic", self.spec.vocab_size, 256, None, seed=1)
        self.count = 0

    def step(self) -> float:
        import torch
        import torch.distributed as dist

        from runtime.data import step_micro_batches

        g, lay = self.groups, self.lay
        mbs = [{k: v.to(self.device) for k, v in mb.items()} for mb in
               step_micro_batches(self.source, self.spec.family, self.spec.vocab_size, 256, self.shape.global_batch,
                                  1, lay.dp, g.dp_rank, self.count, lay.cp, g.cp_rank, seed=1)]
        self.count += 1
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        self.step_fn(self.stages, mbs, self.opt, g, 1e-4)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slowest rank sets the step
        return float(t)

    def close(self):
        self.opt.close()


def _step_wall_s(lay, layers: int, recompute: str, device, experts: int = 1, steps: int = 14, warmup: int = 3,
                 family: str = "llama") -> float:
    """Median wall seconds of a training step of the probe model under `lay` (every rank calls this)."""
    run = _ProbeRun(lay, layers, recompute, device, experts, family)
    try:
        times = [run.step() for _ in range(steps)][warmup:]
    finally:
        run.close()
    return statistics.median(times)


ROUNDS, STEPS_PER_ROUND, WARMUP_STEPS = 3, 4, 3
"""The two depths are timed in alternating rounds, and the per-layer figure is the median over rounds of
the difference of the round medians. Timing each depth in one block made a transient (another process, a
clock change) that fell on one block land whole in the difference (once llama's selective recompute at 5.1 ms per
layer, above its full recompute at 3.8 ms)."""


_GROUPS: dict = {}
"""Process groups by degrees, built once per probe process: creating NCCL communicators for every figure takes
about 150 s of a 270 s profile (as `plan launch` with several plans does, a layout of the same degrees reuses
them)."""


def _groups_for(lay, device_type: str):
    from runtime.mesh import build_groups

    key = (lay.tp, lay.cp, lay.dp, lay.pp, lay.ep, device_type)
    if key not in _GROUPS:
        _GROUPS[key] = build_groups(lay, device_type)
    groups = _GROUPS[key]
    groups.layout = lay  # same degrees; the rest (sharding, micro-batch) is this figure's
    return groups


def _depth_difference_s(lay, recompute, device, experts=1, family="llama") -> tuple[float, float]:
    """(step seconds at the larger depth minus the smaller, step seconds at the smaller depth), robust to drift."""
    groups = _groups_for(lay, device.type)  # one set of communicators for both depths and every figure
    runs = [_ProbeRun(lay, n, recompute, device, experts, family, groups) for n in DEPTHS]
    try:
        for run in runs:
            for _ in range(WARMUP_STEPS):
                run.step()
        diffs, lows = [], []
        for r in range(ROUNDS):
            med = {}
            for i in ((0, 1) if r % 2 == 0 else (1, 0)):  # alternate which depth goes first
                med[i] = statistics.median(runs[i].step() for _ in range(STEPS_PER_ROUND))
            diffs.append(med[1] - med[0])
            lows.append(med[0])
    finally:
        for run in runs:
            run.close()
    return statistics.median(diffs), statistics.median(lows)


_T0 = time.monotonic()


def _log(msg: str) -> None:
    """One progress line on stderr from rank 0 (how long each figure took: the probe has no progress bar)."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_rank() == 0:
        print(f"[host probe +{time.monotonic() - _T0:.0f}s] {msg}", file=sys.stderr, flush=True)


def _per_layer_s(lay, recompute, device, experts=1, family="llama", with_ends=False):
    """Seconds per layer and micro-batch: the difference of two depths, per micro-batch. with_ends: also
    the rest of a micro-batch (embedding, head, loss, and the step's own costs spread over its
    micro-batches): the step at the smaller depth minus its layers, per micro-batch."""
    diff, lo = _depth_difference_s(lay, recompute, device, experts, family)
    _log(f"{family} {recompute} tp{lay.tp} cp{lay.cp} dp{lay.dp} ep{lay.ep} {lay.sharding} experts {experts}")
    per_rank_layers = (DEPTHS[1] - DEPTHS[0]) / lay.pp
    slope = max(diff, 0.0) / (per_rank_layers * MICRO_BATCHES)
    if not with_ends:
        return slope
    return slope, max(lo - DEPTHS[0] / lay.pp * MICRO_BATCHES * slope, 0.0) / MICRO_BATCHES


def probe(world: int, device) -> dict:
    """All figures this world size allows (every rank calls it; rank 0's result is the one kept)."""
    from planner.plan import Layout

    def L(**k):
        base = dict(tp=1, pp=1, vpp=1, dp=1, cp=1, ep=1, micro_batch=1, sharding="optimizer")
        base.update(k)
        return Layout(**base)

    out: dict = {"world": world, "layer_s": {}, "tp_extra_s": {}, "family_layer_s": {}, "family_ends_s": {}}
    dp = L(dp=world) if world > 1 else L(sharding="none")
    for name in probed_families():
        none, ends = _per_layer_s(dp, "none", device, family=name, with_ends=True)
        out["family_layer_s"][name] = {"none": none, **{mode: _per_layer_s(dp, mode, device, family=name)
                                                        for mode in ("selective", "full")}}
        out["family_ends_s"][name] = ends
    out["layer_s"] = dict(out["family_layer_s"]["llama"])
    out["ends_s"] = out["family_ends_s"]["llama"]
    moe = _per_layer_s(dp, "none", device, experts=PROBE_EXPERTS)
    out["expert_s"] = max(moe - out["layer_s"]["none"], 0.0) / PROBE_EXPERTS
    if world >= 2:
        for mode in ("none", "selective", "full"):
            out["tp_extra_s"][mode] = max(_per_layer_s(L(tp=2), mode, device) - out["layer_s"][mode], 0.0)
        out["cp_extra_s"] = max(_per_layer_s(L(cp=2), "none", device) - out["layer_s"]["none"], 0.0)
        out["fsdp_extra_s"] = max(_per_layer_s(L(dp=2, sharding="full"), "none", device) - out["layer_s"]["none"], 0.0)
        ep2 = _per_layer_s(L(dp=2, ep=2), "none", device, experts=PROBE_EXPERTS)
        out["ep_extra_s"] = max(ep2 - moe, 0.0)
        one, two = (_step_wall_s(L(pp=2, vpp=v), 4, "none", device) for v in (1, 2))
        out["pp_chunk_s"] = max(two - one, 0.0) / MICRO_BATCHES
    return out


def probe_single_rank(world: int, device) -> dict:
    """Per family, recompute none and the ends in one process without data parallelism (world == 1)."""
    from planner.plan import Layout

    lay = Layout(tp=1, pp=1, vpp=1, dp=1, cp=1, ep=1, micro_batch=1, sharding="none")
    out: dict = {"family_single_rank_layer_s": {}, "family_single_rank_ends_s": {}}
    for name in probed_families():
        none, ends = _per_layer_s(lay, "none", device, family=name, with_ends=True)
        out["family_single_rank_layer_s"][name] = none
        out["family_single_rank_ends_s"][name] = ends
    return out


def measure(device_type: str, world: int) -> dict:
    """Spawn `world` processes and return the host figures (seconds); with world > 1 also the single-rank
    figures, from one process spawned after them."""
    from runtime.profiler.spawn import run_spawned

    out = run_spawned(probe, world, device_type == "cuda")
    if world > 1:
        out.update(run_spawned(probe_single_rank, 1, device_type == "cuda"))
    return out


def main(argv=None) -> int:
    from planner.errors import PlanError
    from planner.profile import HostOverheads, Profile, shipped_profile_path

    ap = argparse.ArgumentParser(prog="python -m runtime.profiler.host", description=__doc__.splitlines()[0])
    ap.add_argument("--profile", required=True, help="profile to add the host figures to")
    ap.add_argument("--out", required=True, help="the profile to write (must not exist)")
    ap.add_argument("--gpus", type=int, default=None,
                    help="processes for the data-parallel figures (default: 2, or 1 where one GPU is visible, which "
                         "measures the single-rank figures only)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--single-rank-only", action="store_true",
                    help="measure only the single-rank figures and add them to the profile's host figures")
    args = ap.parse_args(argv)
    try:
        if Path(args.out).exists():
            raise PlanError(f"'{args.out}' already exists")
        prof = Profile.load(Path(args.profile) if Path(args.profile).exists() else shipped_profile_path(args.profile))
        if args.device == "cuda":
            import torch

            visible = torch.cuda.device_count()
            if visible == 0:
                raise PlanError("no CUDA GPU is visible; pass --device cpu to probe the host on CPU")
            if args.gpus is not None and args.gpus > visible:
                raise PlanError(f"--gpus {args.gpus} asks for more GPUs than the {visible} visible")
            args.gpus = args.gpus or min(2, visible)
        args.gpus = args.gpus or 2
        if args.gpus == 1 and not args.single_rank_only:
            # the base figures are data-parallel (two processes): one GPU measures the single-rank ones only
            print("one process: measuring the single-rank host figures only (--single-rank-only)", file=sys.stderr)
            args.single_rank_only = True
        from dataclasses import replace

        from runtime.profiler.environment import git_commit
        def part_of(name: str, how: str) -> dict:
            return {"part": name, "status": "measured", "how": how,
                    "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "seconds": round(time.time() - t0, 1), **git_commit()}

        t0 = time.time()
        if args.single_rank_only:
            if prof.host is None:
                raise PlanError(f"'{args.profile}' has no host figures to add single-rank ones to")
            from runtime.profiler.spawn import run_spawned
            raw = run_spawned(probe_single_rank, 1, args.device == "cuda")
            host = replace(prof.host, family_single_rank_layer_s=raw["family_single_rank_layer_s"],
                           family_single_rank_ends_s=raw["family_single_rank_ends_s"])
            part = part_of("host_overhead/single_rank",
                           f"runtime training steps of a hidden-256 probe ({', '.join(probed_families())}) in one "
                           f"{args.device} process, no data parallelism, 2 vs 6 layers, {MICRO_BATCHES} micro-batches "
                           "(runtime/profiler/host.py --single-rank-only); the other host figures are the input "
                           "profile's")
            keep = lambda p: p.get("part") != "host_overhead/single_rank"  # noqa: E731
        else:
            raw = measure(args.device, args.gpus)
            host = HostOverheads.from_measurement(raw)
            part = part_of("host_overhead",
                           f"runtime training steps of a hidden-256 probe ({', '.join(probed_families())}) in "
                           f"{args.gpus} "
                           f"{args.device} process(es) and, for the single-rank figures, in one; 2 vs 6 layers, "
                           f"{MICRO_BATCHES} micro-batches (runtime/profiler/host.py)")
            keep = lambda p: not str(p.get("part", "")).startswith("host_overhead")  # noqa: E731
        prov = dict(prof.provenance)
        prov["parts"] = [p for p in prov.get("parts", []) if keep(p)] + [part]
        replace(prof, host=host, provenance=prov).save(Path(args.out))
        print(json.dumps(raw, indent=1))
        print(f"wrote {args.out}")
        return 0
    except PlanError as exc:
        print(f"plan: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
