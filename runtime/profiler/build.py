"""Assembles a planner.profile.Profile from the measurements, with full provenance.

Order: collectives first (spawned processes, GPU otherwise idle), then the host time per layer, attention,
memory-bound kernels, optimizer, launch overhead, and last the GEMM grid, which gets whatever remains of the
time budget (its shapes are ordered coarse to fine, so a cut thins the grid evenly; the cut is recorded). The
grid is split across the node's GPUs, shape i on GPU i mod n (gemm_workers.py); the MoE experts' grouped GEMMs
follow where time is left.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import torch

from planner.errors import PlanError
from planner.profile import physics
from planner.profile import ATTENTION_POINT_KEYS, Profile, gpu_kind_of_device
from runtime.profiler import collectives as coll
from runtime.profiler import environment, kernels, modelled, shapes
from runtime.profiler import grouped as grouped_
from runtime.profiler.gemm_workers import time_gemms_parallel
from runtime.profiler.timing import at_power_cap, power_state_under_heat
from runtime.profiler.devices import _split_how, gemm_devices, recorded_gpu_kind  # noqa: F401 (re-exported)


@dataclass
class Options:
    """What `plan profile` measures and how: the device, the processes, the mode, the time budget, the modelled
    network, the power-cap timing, the host stage and the models whose GEMMs come first."""
    device: str = "cuda"
    gpus: int | None = None
    """Processes for the collectives (GPUs on CUDA; default all visible GPUs, 2 on CPU)."""
    quick: bool = False
    gpu_kind: str | None = None
    """Planner GPU kind to record (default: from the device name; 'cpu' on CPU)."""
    budget_s: float | None = None
    """Wall-clock budget for the whole profile (default 270 s full, 50 s quick on GPU)."""
    nic_gb_per_s: float = modelled.NIC_GB_PER_S
    nic_latency_us: float = modelled.NIC_LATENCY_US
    max_nvlink_group: int = 8
    at_power_cap: bool = True
    """Time the kernels with the GPU held at its power cap, where sustained training runs (runtime/profiler/
    timing.py, PowerHeater); False: in short bursts at whatever clock the GPU is at (`plan profile --burst`)."""
    host: bool = True
    """Measure the host time per layer (runtime/profiler/host.py; GPU, full profiles only)."""
    models: tuple = ()
    """ModelSpecs whose every GEMM (shapes.model_gemm_shapes, at each model's default sequence length) is timed
    first, before the catalogue grid (`plan profile --model`)."""


ATTENTION_REPS = {"cuda": dict(warmup=2, repeats=5), "cpu": dict(warmup=1, repeats=3)}


class Reporter:
    """Progress sink; the CLI's rich progress bar implements it. Stages report steps as they finish."""

    def stage(self, name: str, total: int) -> None:  # noqa: D401
        pass

    def advance(self, n: int = 1) -> None:
        pass


def resolve_device(opts: Options) -> tuple[torch.device, int, str]:
    """(device for the kernels, processes for the collectives, GPU kind), or a PlanError in one sentence."""
    if opts.device not in ("cuda", "cpu"):
        raise PlanError(f"--device must be 'cuda' or 'cpu', not '{opts.device}'")
    if opts.device == "cuda":
        if not torch.cuda.is_available():
            raise PlanError("no CUDA device is visible; run on a GPU machine or pass --device cpu")
        visible = torch.cuda.device_count()
        n = visible if opts.gpus is None else opts.gpus
        if not 1 <= n <= visible:
            raise PlanError(f"--gpus {n} is not possible: {visible} GPU(s) are visible")
        name = torch.cuda.get_device_name(0)
        return torch.device("cuda", 0), n, recorded_gpu_kind(opts.gpu_kind, gpu_kind_of_device(name), name)
    n = 2 if opts.gpus is None else opts.gpus
    if not 1 <= n <= 16:
        raise PlanError(f"--gpus {n} is not possible on CPU: use 1 to 16 processes")
    return torch.device("cpu"), n, recorded_gpu_kind(opts.gpu_kind, "cpu", "the CPU")


@dataclass
class _ProfileRun:
    """What the steps of one profile build share: the options, the progress sink, where the kernels run, the time
    budget's deadline, and the records each step adds to (the provenance, its parts, the extras, the GPU's power
    states). `done(name)` records the seconds since the previous stage ended as that stage's."""
    opts: Options
    rep: Reporter
    device: torch.device
    world: int
    kind: str
    budget_s: float
    t_start: float
    prov: dict
    parts: list[dict] = field(default_factory=list)
    extras: dict = field(default_factory=lambda: {"stage_seconds": {}})
    power_states: dict = field(default_factory=dict)
    stage_t: float = 0.0

    @property
    def cuda(self) -> bool:
        """Whether the kernels run on a GPU."""
        return self.device.type == "cuda"

    @property
    def deadline(self) -> float:
        """When the time budget runs out (time.monotonic())."""
        return self.t_start + self.budget_s

    def done(self, name: str) -> None:
        """Record the seconds since the previous stage ended as stage `name`'s (extras.stage_seconds)."""
        self.extras["stage_seconds"][name] = round(time.monotonic() - self.stage_t, 2)
        self.stage_t = time.monotonic()


@dataclass
class _GemmGrid:
    """The GEMM shapes a profile times, in the order it times them (those of the models asked for first, then the
    catalogue grid's bf16 powers of two, FP8, and the bf16 shapes in between), and where they came from."""
    spec: shapes.GridSpec
    shapes: list
    fp8_count: int
    exact: dict
    """key -> GemmShape of the models asked for (--model)."""


def build_profile(opts: Options, reporter: Reporter | None = None) -> Profile:
    """Measure this device (or node) and return its Profile, every part's provenance recorded.

    The steps run in the order of the module's docstring; the kernels from attention to the GEMM grid are timed
    with the GPU at its power cap (Options.at_power_cap). A GPU kind that planner.profile.physics knows gets its
    unmeasured collectives from the physics model, after the build.

    Args:
        opts: what to measure and how long it may take.
        reporter: the progress sink (default: none).

    Returns:
        The Profile, ready to write.

    Raises:
        PlanError: bad options, or a time budget too short to time any forward GEMM.
    """
    run = _start(opts, reporter or Reporter())
    by_physics = run.cuda and run.kind in physics.NODES
    fits = _collectives(run, by_physics)
    host = _host_overheads(run)

    # -- kernels, from here to the GEMM grid: timed at the power cap (timing.at_power_cap) -------------------------
    heat = contextlib.ExitStack()
    heat.enter_context(at_power_cap(run.device, opts.at_power_cap))
    run.power_states["first_heat"] = environment.gpu_power_state(run.device) if run.cuda else None
    att_points = _attention(run)
    memory_bound = _memory_bound(run)
    grid = _gemm_grid(run)
    points, spreads, skipped, n_devices = _time_gemm_grid(run, grid)
    run.power_states["after_gemms"] = power_state_under_heat(run.device)
    heat.close()
    if not points:
        raise PlanError("the time budget ran out before any GEMM was timed; give a larger --budget")
    tables = _gemm_tables(run, grid, points, spreads, skipped, n_devices)
    grouped_points = _grouped_gemms(run, grid.spec)
    if run.cuda:
        run.parts.append(_kernel_timing_part(run))
    return _assemble(run, fits, host, att_points, memory_bound, tables, grouped_points, by_physics)


def _start(opts: Options, rep: Reporter) -> _ProfileRun:
    """Resolve the device, force the collectives' environment, set the threads (one per process on CPU) or the
    CUDA device, and open the provenance with the environment, the mode and the time budget (default 270 s full,
    50 s quick on GPU; 120 s and 40 s on CPU)."""
    device, world, kind = resolve_device(opts)
    cuda = device.type == "cuda"
    coll.force_env()
    if not cuda:
        torch.set_num_threads(1)   # one thread per process: oversubscribed OpenMP stalls for ~10 ms at a time
    else:
        torch.cuda.set_device(device)
    budget = opts.budget_s or ((50.0 if opts.quick else 270.0) if cuda else (40.0 if opts.quick else 120.0))
    t_start = time.monotonic()
    prov = environment.describe(device, world)
    prov.update({"tool": "plan profile (runtime/profiler)", "mode": "quick" if opts.quick else "full",
                 "compute_dtype": str(kernels.compute_dtype(device)).replace("torch.", ""),
                 "environment_forced": dict(coll.FORCED_ENV), "budget_s": budget})
    return _ProfileRun(opts, rep, device, world, kind, budget, t_start, prov, stage_t=time.monotonic())


def _collectives(run: _ProfileRun, by_physics: bool) -> list:
    """The collectives' fits: measured across the node's processes (with larger NVSwitch groups extrapolated from
    them), or modelled from the datasheet NVLink on one GPU; and the network modelled from the NIC options.
    `by_physics`: the GPU kind is one planner.profile.physics knows, which then supplies the unmeasured NVLink
    groups and the network after the build, instead of runtime/profiler/modelled.py."""
    opts, world, cuda = run.opts, run.world, run.cuda
    link = "nvlink" if cuda else "loopback"
    fits = []
    if world >= 2:
        run.rep.stage(f"collectives ({world} {'GPUs' if cuda else 'processes'}, {'NCCL' if cuda else 'gloo'})",
                      coll.steps(world, run.device.type, opts.quick))
        raw = coll.measure(run.device.type, world, opts.quick, progress=run.rep.advance)
        fits, fit_errors = coll.fit_points(raw, link)
        run.extras["collective_fit_errors"] = fit_errors
        run.parts.append({"part": f"collectives/{link}", "status": "measured",
                          "group_sizes": coll.group_sizes(world), "ops": list(coll.OPS),
                          "sizes_bytes": [coll.message_sizes(run.device.type, opts.quick)[0],
                                          coll.message_sizes(run.device.type, opts.quick)[-1]],
                          "how": "torch.distributed in spawned processes; median of repeats of back-to-back batches, "
                                 "slowest rank; bytes = full buffer (nccl-tests busbw convention); fit = "
                                 f"planner.profile.fit_collective over sizes >= {coll.FIT_MIN_BYTES} bytes"})
        more = [] if by_physics else modelled.nvswitch_groups(fits, opts.max_nvlink_group, link)
        if more:
            run.parts.append({"part": f"collectives/{link} groups " + ",".join(sorted({str(f.group_size) for f in more},
                                                                                     key=int)),
                              "status": "modelled",
                              "model": f"bus bandwidth of the largest measured group ({max(f.group_size for f in fits)}),"
                                       " latency x (n-1)/(n0-1); send_recv copies the measured pair",
                              "source": "NVSwitch: each GPU drives its own NVLinks, so per-GPU bus bandwidth holds"})
        fits += more
        run.done("collectives")
    elif cuda and not by_physics:
        from planner.cluster import GPU_KINDS
        nv = GPU_KINDS[run.kind].nvlink_gb_per_s if run.kind in GPU_KINDS else 450.0
        fits = modelled.single_gpu_nvlink(nv, opts.max_nvlink_group)
        run.parts.append({"part": "collectives/nvlink", "status": "modelled",
                          "model": f"datasheet NVLink {nv} GB/s x efficiency {modelled.NVLINK_EFFICIENCY:.3f}, "
                                   f"latency {modelled.NVLINK_LATENCY_S * 1e6:.0f} us x (n-1)",
                          "source": "only one GPU was available; efficiency from ../shared/reference/h200x2-ceilings.jsonl"})
    if cuda and not by_physics:
        net = modelled.network_links(opts.nic_gb_per_s, opts.nic_latency_us)
        fits += net
        run.parts.append({"part": "collectives/network", "status": "modelled",
                          "model": f"NIC {opts.nic_gb_per_s} GB/s per GPU, {opts.nic_latency_us} us per hop",
                          "source": modelled.NIC_SOURCE})
        run.extras["network_model"] = {"nic_gb_per_s": opts.nic_gb_per_s, "latency_us": opts.nic_latency_us}
    return fits


def _host_overheads(run: _ProfileRun):
    """The host time per layer (HostOverheads), from runtime steps of a narrow probe model; None on CPU (where
    the host is the device), with --quick (about two minutes; the planner then has no host floor) or --no-host."""
    if not (run.cuda and not run.opts.quick and run.opts.host):
        return None
    from planner.profile import HostOverheads
    from runtime.profiler import host as host_mod
    run.rep.stage("host time per layer (runtime steps of a narrow probe model)", 1)
    host = HostOverheads.from_measurement(host_mod.measure(run.device.type, run.world))
    run.rep.advance(1)
    run.parts.append({"part": "host_overhead", "status": "measured",
                      "how": f"runtime training steps of a hidden-256 probe model in {run.world} process(es) (and in "
                             "one, for the single-rank figures), 2 vs 6 layers (runtime/profiler/host.py)"})
    run.done("host")
    return host


def _attention(run: _ProfileRun) -> list[dict]:
    """Time SDPA forward and backward over the attention grid (plus the head dimensions of the models asked for
    that the grid lacks: an unmeasured one is priced as the next larger measured, Profile.attention_kernel_head_dim,
    which is right for the kernels' padding), and GQA against MHA at a few shapes (extras.attention_gqa). Returns
    the grid's timed points."""
    device, opts = run.device, run.opts
    att_grid = shapes.attention_grid(device.type, opts.quick)
    grid_dims = {p["head_dim"] for p in att_grid}
    model_dims = sorted({spec.head_dim for spec in opts.models} - grid_dims)
    if model_dims:
        att_grid += shapes.attention_grid(device.type, opts.quick, model_dims)
    gqa_grid = []
    if run.cuda:
        gqa_grid = [dict(batch=4, heads=32, kv_heads=8, seq=4096, head_dim=128, causal=True)]
        if not opts.quick:
            gqa_grid.append(dict(batch=2, heads=32, kv_heads=8, seq=8192, head_dim=128, causal=True))
    else:
        gqa_grid = [dict(batch=2, heads=4, kv_heads=2, seq=64, head_dim=16, causal=True)]
    run.rep.stage("attention (SDPA fwd+bwd)", len(att_grid) + len(gqa_grid))
    reps = ATTENTION_REPS[device.type]
    att_points = []
    for p in att_grid:
        att_points.append(kernels.time_attention(**p, device=device, **reps))
        run.rep.advance()
    gqa = []
    for p in gqa_grid:
        r = kernels.time_attention(**p, device=device, **reps)
        mha = kernels.time_attention(**{**p, "kv_heads": 0}, device=device, **reps)
        r["fwd_vs_mha"] = r["fwd_tflops"] / mha["fwd_tflops"]
        r["bwd_vs_mha"] = r["bwd_tflops"] / mha["bwd_tflops"]
        gqa.append(r)
        run.rep.advance()
    run.extras["attention_gqa"] = gqa
    run.parts.append({"part": "attention", "status": "measured",
                      "how": "F.scaled_dot_product_attention fwd and bwd (autograd.grad, graph kept), bf16 on GPU; "
                             "TFLOP/s count causal work halved and backward as 2.5x forward; GQA (enable_gqa) checked "
                             "against MHA in extras.attention_gqa"})
    if run.cuda:
        torch.cuda.empty_cache()
    run.power_states["after_attention"] = power_state_under_heat(device)
    run.done("attention")
    return att_points


@dataclass
class _MemoryBound:
    """The memory-bound and host figures of a profile."""
    copy_bandwidth_bytes_per_s: float
    elementwise_efficiency: float
    optimizer_s_per_param: float
    kernel_launch_s: float


def _memory_bound(run: _ProfileRun) -> _MemoryBound:
    """Time the copy bandwidth, the elementwise kernels against it, the embedding and loss, the optimizer step per
    parameter and the kernel launch overhead (and a sustained GEMM, a diagnostic in extras)."""
    device, cuda = run.device, run.cuda
    run.rep.stage("memory-bound kernels, optimizer, launch", 5)
    copy_numel = (256 << 20) if cuda else (1 << 20)
    copy_bw, copy_t = kernels.copy_bandwidth(device, copy_numel)
    run.rep.advance()
    tokens, hidden = ((8192 if run.opts.quick else 32768), 4096) if cuda else (256, 256)
    elem = kernels.time_elementwise(device, tokens, hidden, copy_bw)
    eff = kernels.elementwise_efficiency(elem, copy_bw)
    run.rep.advance()
    run.extras["elementwise"] = {"tokens": tokens, "hidden": hidden, "kernels": elem,
                                 "efficiency_rule": "sum(bytes) / sum(seconds) / copy bandwidth over these kernels"}
    run.extras["embedding_and_loss"] = kernels.time_embedding_and_loss(
        device, 8192 if cuda else 256, 4096 if cuda else 64, 32000 if cuda else 512, copy_bw)
    run.rep.advance()
    if cuda:
        torch.cuda.empty_cache()
    opt_s, opt_impl = kernels.optimizer_step_s_per_param(device, (64 << 20) if cuda else (1 << 18))
    run.rep.advance()
    launch = kernels.launch_overhead_s(device)
    run.extras["sustained_gemm"] = kernels.sustained_gemm(device, 8192 if cuda else 128, 3.0 if cuda else 0.2)
    run.rep.advance()
    run.parts.extend([
        {"part": "copy_bandwidth", "status": "measured",
         "how": f"y.copy_(x) over {copy_numel * 4} bytes fp32, read + write counted"},
        {"part": "elementwise_efficiency", "status": "measured",
         "how": "LayerNorm, RMSNorm, GELU, SwiGLU, rotary, residual add, forward and backward; "
                "minimum bytes moved / time / copy bandwidth (per kernel in extras.elementwise)"},
        {"part": "optimizer_s_per_param", "status": "measured",
         "how": f"the runtime's AdamW step, {opt_impl}: fp32 master, gradient, m, v and the compute-dtype "
                "weights in one pass, per parameter"},
        {"part": "kernel_launch_s", "status": "measured", "how": "host time per small eager op"},
    ])
    run.done("memory_bound")
    return _MemoryBound(copy_bw, eff, opt_s, launch)


def _gemm_grid(run: _ProfileRun) -> _GemmGrid:
    """The GEMM shapes to time, in order: every GEMM of the models asked for (--model, at their default sequence),
    then the catalogue grid's bf16 powers of two, FP8 at the common token counts (where the device runs FP8 and
    not --quick), and the bf16 3 x 2^e in between. A cut by the time budget thus thins the grid evenly."""
    opts = run.opts
    grid_spec = shapes.gpu_grid_spec(opts.quick) if run.cuda else shapes.cpu_grid_spec(opts.quick)
    grid = shapes.gemm_grid(grid_spec)
    from runtime.parallel.fp8 import check_fp8_device
    fp8_grid = shapes.fp8_gemm_grid(grid_spec) if check_fp8_device(run.device) is None and not opts.quick else []
    on_lines = [s for s in grid if shapes.on_power_of_two(s)]   # gemm_grid puts them first
    grid = on_lines + fp8_grid + grid[len(on_lines):]
    exact = {}
    for spec in opts.models:
        for g in shapes.model_gemm_shapes(spec, spec.default_seq_len, grid_spec.tp_degrees,
                                          flops_cap=grid_spec.flops_cap):
            exact.setdefault(g.key, g)
    if exact:
        grid = list(exact.values()) + [g for g in grid if g.key not in exact]
    return _GemmGrid(grid_spec, grid, len(fp8_grid), exact)


def _time_gemm_grid(run: _ProfileRun, grid: _GemmGrid):
    """Time the grid's shapes in order, split across the node's GPUs (gemm_devices), until the deadline.
    Returns (points (m, n, k, seconds, kind), their spreads, shapes skipped, devices used)."""
    run.rep.stage(f"GEMMs ({len(grid.shapes)} shapes: {len(grid.exact)} of the models asked for, the rest from the "
                  f"catalogue, {grid.fp8_count} of them FP8)", len(grid.shapes))
    greps = (dict(warmup=2, repeats=5) if run.opts.quick else dict(warmup=2, repeats=7)) if run.cuda else \
        dict(warmup=1, repeats=3)
    devices = gemm_devices(run.device, run.world)
    if run.cuda:
        torch.cuda.empty_cache()   # the worker on GPU 0 sizes its operand pool from the free memory
    points, spreads, skipped = time_gemms_parallel(grid.shapes, devices, deadline=run.deadline,
                                                   progress=run.rep.advance, at_power_cap=run.opts.at_power_cap,
                                                   **greps)
    return points, spreads, skipped, len(devices)


def _gemm_tables(run: _ProfileRun, grid: _GemmGrid, points, spreads, skipped: int, n_devices: int) -> dict:
    """Sort the timed GEMMs into the profile's tables (forward/dgrad "mm", "wgrad", "fp8": (m, n, k, seconds)
    each), with their spreads and the grid's description in the extras and the gemm part's provenance."""
    tables = {"mm": [], "wgrad": [], "fp8": []}   # (m, n, k, seconds) per table, spreads aligned with them
    table_spreads = {name: [] for name in tables}
    for (m, n, k, t, knd), sp in zip(points, spreads):
        name = shapes.GemmShape(m, n, k, knd).table
        tables[name].append((m, n, k, t))
        table_spreads[name].append(sp)
    spec, opts, exact = grid.spec, run.opts, grid.exact
    run.extras["gemm_spread"] = table_spreads["mm"]
    run.extras["wgrad_spread"] = table_spreads["wgrad"]
    run.extras["fp8_spread"] = table_spreads["fp8"]
    run.extras["gemm_grid"] = {
        "models": [m.name for m in spec.models], "tp": list(spec.tp_degrees),
        "tokens": [min(spec.tokens), max(spec.tokens)], "flops_cap": spec.flops_cap,
        "shapes": len(grid.shapes), "timed": len(points), "skipped_by_budget": skipped, "devices": n_devices,
        "tables": "gemm.points: forward and dgrad (bf16 output); gemm.wgrad_points: wgrad (fp32 accumulation); "
                  "gemm.fp8_points: forward and dgrad through runtime/parallel/fp8.py (scaling included)",
        "fp8_shapes": grid.fp8_count,
        "exact_models": [s.name for s in opts.models], "exact_shapes": len(exact),
        "convention": "as runtime/parallel/tensor.py: forward (m=tokens, n=n_out, k=k_in) = F.linear(x, W); "
                      "dgrad (tokens, k_in, n_out) = dY @ W; wgrad (n_out, k_in, tokens) = main_grad += dY^T @ X "
                      "(accumulated into an fp32 main gradient by the GEMM: gradient-accumulation fusion)",
    }
    run.parts.append({"part": "gemm", "status": "measured",
                      "how": (f"first every GEMM of {', '.join(s.name for s in opts.models)} ({len(exact)} shapes, "
                              "micro-batches 1-16 x CP 1-8 at its default sequence), then " if exact else "")
                             + f"{len(points)} of {len(grid.shapes)} catalogue shapes (TP {list(spec.tp_degrees)}, fwd/dgrad/"
                             "wgrad, and fwd/dgrad in FP8 at the common token counts), median of repeats after warm-up, device time (host launch excluded), inputs "
                             f"rotated over > 2x L2; {_split_how(n_devices, run.cuda)}" + (f"; {skipped} shapes skipped (time budget, or operands beyond the memory pool)"
                                                                                           if skipped else "")})
    run.done("gemm")
    return tables


def _grouped_gemms(run: _ProfileRun, grid_spec) -> list:
    """The MoE experts' grouped GEMMs (planner/profile/grouped.py) of the grid's and the asked-for MoE models,
    where there are any, the profile is full and the budget has time left; else none."""
    opts = run.opts
    moe = [spec for spec in list(grid_spec.models) + list(opts.models) if spec.is_moe]
    if not (moe and not opts.quick and time.monotonic() < run.deadline):
        return []
    run.rep.stage(f"grouped GEMMs of the MoE experts ({', '.join(dict.fromkeys(s.name for s in moe))})", 1)
    t_grouped = time.monotonic()
    heated = run.cuda and opts.at_power_cap
    grouped_points = grouped_.measure([s for spec in moe for s in grouped_.expert_shapes(spec)], run.device,
                                      heated, deadline=run.deadline)
    run.parts.append(grouped_.part_record(grouped_points, list(dict.fromkeys(s.name for s in moe)),
                                          heated, time.monotonic() - t_grouped, {}))
    run.rep.advance()
    return grouped_points


def _kernel_timing_part(run: _ProfileRun) -> dict:
    """How the GPU's kernels were timed (at the power cap, or in short bursts), with the power states seen."""
    return {"part": "kernel_timing", "status": "measured", "at_power_cap": run.opts.at_power_cap,
            "how": ("every kernel (attention, memory-bound, optimizer, GEMMs) timed with the GPU held at its "
                    "power cap by bf16 heater GEMMs before each kernel and each timed batch (runtime/profiler/"
                    "timing.py, at_power_cap): the clock sustained training runs at"
                    if run.opts.at_power_cap else
                    "kernels timed in short bursts at whatever clock the GPU was at (--burst)"),
            "power_states": run.power_states}


def _assemble(run: _ProfileRun, fits: list, host, att_points: list[dict], mb: _MemoryBound, tables: dict,
              grouped_points: list, by_physics: bool) -> Profile:
    """The Profile of the measurements, with the modelled overlap, the provenance's parts and wall time; the
    collectives remodelled by planner.profile.physics where `by_physics`."""
    overlap = dict(modelled.OVERLAP)
    run.parts.append({"part": "overlap_hidden_fraction", "status": "tp: reference measurement; dp/pp/cp/ep: modelled",
                      "detail": modelled.OVERLAP_PROVENANCE})
    prov = run.prov
    prov["parts"] = run.parts
    prov["wall_s"] = round(time.monotonic() - run.t_start, 1)
    att_for_profile = [{k: p[k] for k in ATTENTION_POINT_KEYS} for p in att_points]
    if not tables["mm"]:
        raise PlanError("the time budget ran out before any forward GEMM was timed; give a larger --budget")
    prof = Profile(gpu=run.kind, provenance=prov, gemm_points=tables["mm"], wgrad_points=tables["wgrad"],
                   fp8_points=tables["fp8"], attention_points=att_for_profile,
                   copy_bandwidth_bytes_per_s=mb.copy_bandwidth_bytes_per_s,
                   elementwise_efficiency=mb.elementwise_efficiency, optimizer_s_per_param=mb.optimizer_s_per_param,
                   collectives=fits, overlap_hidden_fraction=overlap, kernel_launch_s=mb.kernel_launch_s,
                   extras=run.extras, host=host, grouped_points=grouped_points)
    if by_physics:  # NVLink groups beyond those measured and the network: from the physics model
        prof = physics.remodel_collectives(prof)
    return prof
