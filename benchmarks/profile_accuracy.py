"""How well a profile predicts what it did not measure (issue 3's bars), on the machine it describes.

- GEMMs left out of the grid (catalogue models at 5 x 2^e token counts, between the grid's 2^e and 3 x 2^e
  models outside the catalogue at powers of two): predicted device time (Profile.gemm_s less its fixed 5 us launch adder) within 5% median and
  15% worst of the measured time (same timer as the profiler).
- FP8 GEMMs (when the profile has an FP8 table) left out of it, timed through runtime/parallel/fp8.py: same
  bars, against Profile.fp8_gemm_s.
- Attention left out of the grid (sequence lengths between grid points, other batch x heads, GQA): same bars
  (prediction: Profile.attention_s less kernel_launch_s).
- Collectives: each measured fit within 10% of freshly measured times for 1 MiB - 1 GiB.
- One transformer layer, forward + backward, three model sizes (runtime.model.build_stage, bf16, GEMM
  weights with fp32 main gradients as in training), at TP1 on one GPU and at TP2 (sequence parallel, the
  runtime's overlapped backward) in two spawned processes: measured against the planner's CostModel for
  the same layer (TP2: with the exposed TP communication it charges).

    python benchmarks/profile_accuracy.py --profile profiles/h200-sxm.json --out benchmarks/results/profile-accuracy-h200
Writes gemm.csv, attention.csv, collectives.csv, layer.csv and summary.json under --out.
"""
from __future__ import annotations

import argparse
import csv
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from planner.model import CATALOGUE, ModelSpec  # noqa: E402
from planner.profile import Profile  # noqa: E402
from runtime.profiler import collectives as coll  # noqa: E402
from runtime.profiler import kernels, shapes  # noqa: E402
from runtime.profiler.timing import at_power_cap, back_to_back_s, time_fn  # noqa: E402


OFF_CATALOGUE = [   # released configs outside the catalogue
    ModelSpec("qwen2-7b", "llama", 28, 3584, 28, 4, 18944, 152064, 32768, 4096, 512),
    ModelSpec("phi3-mini", "llama", 32, 3072, 32, 32, 8192, 32064, 4096, 4096, 512),
    ModelSpec("mistral-nemo-12b", "llama", 40, 5120, 32, 8, 14336, 131072, 131072, 4096, 512, head_dim_override=128),
    ModelSpec("gpt-2.7b", "gpt", 32, 2560, 32, 32, 10240, 50304, 2048, 2048, 512),
]


def _err(pred, meas):
    return pred / meas - 1.0


def _stats(errs, median_bar, worst_bar):
    a = [abs(e) for e in errs]
    if not a:
        return {"n": 0}
    return {"n": len(a), "median_abs_rel_error": statistics.median(a), "worst_abs_rel_error": max(a),
            "median_bar": median_bar, "worst_bar": worst_bar,
            "pass": statistics.median(a) <= median_bar and max(a) <= worst_bar}


def held_out_gemms(profile: Profile, device, n: int, seed: int = 0, first: int = 0) -> list[shapes.GemmShape]:
    """n shapes outside the profile's grid, from position `first` of a seeded shuffle (disjoint ranges give
    disjoint sets: one to develop a GEMM model on, another to report it on)."""
    grid = {(m, nn, k, False) for m, nn, k, _ in profile.gemm_points}
    # an older profile without a wgrad table answers wgrad from its one table: shapes in it are not held out
    grid |= {(m, nn, k, True) for m, nn, k, _ in (profile.wgrad_points or profile.gemm_points)}
    cap = profile.extras.get("gemm_grid", {}).get("flops_cap", 1.5e13)
    cands = []
    if device.type == "cuda":
        # token counts between the grid's (powers of two and 3 x 2^e): micro-batches of 5
        models, toks = list(CATALOGUE.values()), [1280, 2560, 5120, 10240, 20480, 40960]
        models_off, toks_off = OFF_CATALOGUE, [2048, 4096, 8192, 16384]
    else:
        from planner.model import tiny_model
        models, toks = [tiny_model("gpt"), tiny_model("llama")], [24, 48, 96, 192]
        models_off, toks_off = [tiny_model("gpt", name="tiny-wide", hidden=96, ffn_hidden=192, num_heads=4)], [32, 64]
    for ms, ts in ((models, toks), (models_off, toks_off)):
        for spec in ms:
            for tp in shapes.allowed_tp(spec, (1, 2, 4, 8)):
                for _, n_out, k_in in shapes.linear_layers(spec, tp):
                    for t in ts:
                        for s in (shapes.GemmShape(t, n_out, k_in, "fwd"), shapes.GemmShape(t, k_in, n_out, "dgrad"),
                                  shapes.GemmShape(n_out, k_in, t, "wgrad")):
                            if s.key not in grid and s.flops <= cap:
                                cands.append(s)
    uniq = list({s.key: s for s in cands}.values())
    random.Random(seed).shuffle(uniq)
    return uniq[first:first + n]


def _in_passes(items: list, passes: int, time_all) -> list[list]:
    """time_all(items) -> one result per item, run `passes` times, every other pass in reverse order (a case's
    place in the sequence, and so the clock it meets, changes between passes); results[pass][item]."""
    out = []
    for p in range(passes):
        order = list(range(len(items)))[::(-1 if p % 2 else 1)]
        got = time_all([items[i] for i in order])
        res = [None] * len(items)
        for i, r in zip(order, got):
            res[i] = r
        out.append(res)
    return out


def _pass_columns(times: list[float]) -> dict:
    """measured_s: the median over the passes (with one pass, its time); each pass's time and their spread."""
    cols = {"measured_s": statistics.median(times)}
    if len(times) > 1:
        cols.update({f"pass{i + 1}_s": t for i, t in enumerate(times)})
        cols["pass_spread"] = max(times) / min(times) - 1.0
    return cols


def _with_first_pass(stats: dict, first_errs: list[float], passes: int) -> dict:
    if passes > 1 and stats.get("n"):
        stats["passes"] = passes
        stats["first_pass_only"] = _stats(first_errs, stats.get("median_bar"), stats.get("worst_bar"))
    return stats


def _gemms_against(profile, held_out, device, csv_path, passes: int = 1):
    """Time the held-out shapes as the profiler does and compare each with the profile's lookup for its kind
    (wgrad_s, fp8_gemm_s, else gemm_s, less the lookup's launch adder); writes csv_path, returns the stats.
    passes > 1: the whole set timed that many times (_in_passes), each shape's median compared."""
    lookup = {"wgrad": profile.wgrad_s, "fp8fwd": profile.fp8_gemm_s, "fp8dgrad": profile.fp8_gemm_s}

    def time_all(shapes_):
        pts, _, _ = kernels.time_gemms(shapes_, device, warmup=2, repeats=7)
        by_key = {(m, n, k, kind): t for m, n, k, t, kind in pts}
        return [by_key.get((s.m, s.n, s.k, s.kind)) for s in shapes_]

    with at_power_cap(device, profile.kernels_timed_at_power_cap):
        runs = _in_passes(held_out, passes, time_all)
    rows, errs, first = [], [], []
    for i, s in enumerate(held_out):
        times = [r[i] for r in runs]
        if any(t is None for t in times):  # skipped by time_gemms (beyond the memory pool)
            continue
        pred = lookup.get(s.kind, profile.gemm_s)(s.m, s.n, s.k) - profile.gemm_launch_s  # the fixed term Profile adds to every GEMM
        cols = _pass_columns(times)
        e = _err(pred, cols["measured_s"])
        errs.append(e)
        first.append(_err(pred, times[0]))
        rows.append({"m": s.m, "n": s.n, "k": s.k, "kind": s.kind, **cols, "predicted_s": pred, "rel_error": e,
                     "measured_tflops": 2.0 * s.m * s.n * s.k / cols["measured_s"] / 1e12})
    _csv(csv_path, rows)
    return _with_first_pass(_stats(errs, 0.05, 0.15), first, passes)


def bench_gemm(profile, device, n, out_dir, first=0, passes=1):
    return _gemms_against(profile, held_out_gemms(profile, device, n, first=first), device, out_dir / "gemm.csv",
                          passes)


def held_out_fp8_gemms(profile: Profile, n: int, seed: int = 0) -> list[shapes.GemmShape]:
    """n FP8 shapes outside the profile's FP8 table: the dense layers at 3 x 2^e and 5 x 2^e token counts
    between its powers of two, and the off-catalogue models at powers of two."""
    have = {(m, nn, k) for m, nn, k, _ in profile.fp8_points}
    cands = []
    for ms, toks in ((list(CATALOGUE.values()), [1536, 2560, 3072, 5120, 6144, 12288]),
                     (OFF_CATALOGUE, [1024, 2048, 4096, 8192, 16384])):
        grid = shapes.fp8_gemm_grid(shapes.GridSpec(models=tuple(ms), tokens=tuple(toks), flops_cap=1.5e13,
                                                    max_shapes=10 ** 6), tokens=toks)
        cands += [s for s in grid if (s.m, s.n, s.k) not in have]
    uniq = list({(s.m, s.n, s.k): s for s in cands}.values())
    random.Random(seed).shuffle(uniq)
    return uniq[:n]


def bench_fp8(profile, device, n, out_dir):
    """FP8 GEMMs (runtime/parallel/fp8.py, scaling included) left out of the profile's FP8 table, against
    Profile.fp8_gemm_s; skipped when the profile has no FP8 table (its FP8 times are then modelled)."""
    from runtime.parallel.fp8 import check_fp8_device
    if not profile.fp8_points:
        return {"skipped": "the profile has no FP8 table (fp8_gemm_s is modelled)"}
    why = check_fp8_device(device)
    if why:
        return {"skipped": why}
    return _gemms_against(profile, held_out_fp8_gemms(profile, n), device, out_dir / "fp8.csv")


def bench_attention(profile, device, out_dir, passes=1):
    if device.type == "cuda":
        cases = [dict(batch=b, heads=h, kv_heads=kv, seq=s, head_dim=d, causal=c)
                 for s, b, h, kv in [(1536, 8, 32, 8), (3072, 4, 16, 16), (6144, 2, 32, 8), (12288, 1, 16, 16),
                                     (24576, 1, 8, 8), (49152, 1, 8, 8)]
                 for d in (64, 128) for c in (True, False)]
    else:
        cases = [dict(batch=1, heads=2, kv_heads=kv, seq=s, head_dim=d, causal=c)
                 for s, kv in [(24, 2), (48, 1), (96, 2)] for d in (16, 32) for c in (True, False)]
    rows, errs, first = [], [], []
    with at_power_cap(device, profile.kernels_timed_at_power_cap):
        runs = _in_passes(cases, passes, lambda cs_: [kernels.time_attention(**c, device=device) for c in cs_])
    for i, cs in enumerate(cases):
        for bwd, key in ((False, "fwd_s"), (True, "bwd_s")):
            pred = profile.attention_s(cs["batch"], cs["heads"], cs["seq"], cs["seq"], cs["head_dim"], cs["causal"],
                                       bwd) - profile.kernel_launch_s
            times = [r[i][key] for r in runs]
            cols = _pass_columns(times)
            e = _err(pred, cols["measured_s"])
            errs.append(e)
            first.append(_err(pred, times[0]))
            rows.append({**cs, "backward": bwd, **cols, "predicted_s": pred, "rel_error": e})
    _csv(out_dir / "attention.csv", rows)
    return _with_first_pass(_stats(errs, 0.05, 0.15), first, passes)


def bench_collectives(profile, device, gpus, out_dir):
    if gpus < 2:
        return {"n": 0, "note": "one GPU: nothing to measure"}
    link = "nvlink" if device.type == "cuda" else "loopback"
    raw = coll.measure(device.type, gpus, quick=False)
    rows, errs = [], []
    lo = (1 << 20) if device.type == "cuda" else 4096
    for r in raw:
        if r["bytes"] < lo:
            continue
        pred = profile.collective_s(r["op"], r["bytes"], r["group_size"], link)
        e = _err(pred, r["seconds"])
        errs.append(e)
        rows.append({**r, "predicted_s": pred, "rel_error": e})
    _csv(out_dir / "collectives.csv", rows)
    st = _stats(errs, 0.10, 0.10)
    st["rule"] = "every point from 1 MiB to 1 GiB within 10%"
    return st


def _layer_prediction(p: Profile, spec: ModelSpec, b: int, s: int, tp: int = 1) -> dict:
    """The planner's own prediction of one layer's forward + backward (planner.cost.CostModel), so this
    checks the rule the search uses rather than a second copy of it. TP > 1 includes the exposed TP
    communication the cost model charges. As in CostModel.stage_time_s, the layer takes the larger of its
    GPU time and the host time the profile measured for issuing it (a host-paced layer, such as GPT 1.3B
    at TP2, runs at the host's pace)."""
    from planner.cluster import ClusterSpec
    from planner.cost import CostModel
    from planner.plan import Layout, TrainingShape

    cm = CostModel(spec, TrainingShape(s, b), Layout(tp=tp, micro_batch=b, sharding="none"),
                   ClusterSpec(gpu="h200-sxm", num_gpus=tp, gpus_per_node=max(tp, 1)), p)
    L = cm.layer
    host_s = 0.0
    if p.host is not None:
        host_s = p.host.layer_host_s("none", tp, 1, "none", spec.is_moe, 1, spec.family, p.eff("host_tp"),
                                     p.eff("host_cp"), data_parallel=False) * p.eff("host")
    return {"fwd_s": L.fwd_s, "bwd_s": L.bwd_compute_s + L.bwd_comm_s, "gpu_s": L.fwd_bwd_s, "host_s": host_s,
            "total_s": max(L.fwd_bwd_s, host_s)}


def _as_in_training(stage, dtype):
    """Give the GEMM weights fp32 main gradients (the runtime's gradient-accumulation fusion) and drop each
    gradient once made, as the optimizer's hooks do, so a layer step runs the kernels training runs."""
    for prm in stage.parameters():
        if getattr(prm, "wgrad_fusable", False) and dtype == torch.bfloat16:
            prm.main_grad = torch.zeros(prm.shape, dtype=torch.float32, device=prm.device)
        prm.register_post_accumulate_grad_hook(lambda q: setattr(q, "grad", None))


LAYER_CASES = [("gpt-1.3b", 4, 2048), ("llama3-8b", 1, 8192), ("gpt-13b", 2, 2048)]


SUSTAINED_S = 1.5
"""Seconds a layer is replayed back to back before and while it is timed: the clock settles at the power cap
within ~0.15 s of sustained load (one H200, 2026-12-01), as it does in training."""


def _graphed_layer_s(step, seconds: float = SUSTAINED_S) -> float:
    """Median time of one layer step captured as a CUDA graph and replayed back to back for `seconds`, as the
    runtime replays a whole training step (Layout.cuda_graph, runtime/graph.py): the GPU's time without the
    host's pacing, at the clock sustained training runs at (the median of the second half; nine replays timed right
    after the eager ones would catch whatever clock the GPU had reached). `step(i)` has
    run eagerly before (communicators, cuBLAS and Triton initialised), as capture requires."""
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step(0)
    t = back_to_back_s(g.replay, seconds)
    del g
    return t


def _drop_grad_after_use(xs):
    """Layer inputs are leaves here; in training their gradient goes on to the layer below and is not kept."""
    for x in xs:
        x.register_post_accumulate_grad_hook(lambda q: setattr(q, "grad", None))


def _tp_layer_rows(world: int, device, profile_path: str) -> list[dict]:
    """In each of `world` ranks (runtime.profiler.spawn): the layers at TP `world`; the slowest rank's time."""
    import torch.distributed as dist

    from planner.plan import Layout
    from runtime.mesh import build_groups
    from runtime.model import build_stage

    groups = build_groups(Layout(tp=world, micro_batch=1, sharding="none"), "cuda")
    prof = Profile.load(Path(profile_path))
    rows = []
    for name, b, s in LAYER_CASES:
        spec = CATALOGUE[name]
        stage = build_stage(spec, groups, 0, 1, False, False, ["none"], overlap=True,
                            device=str(device)).to(torch.bfloat16)
        _as_in_training(stage, torch.bfloat16)
        xs = [torch.randn(s // world, b, spec.hidden, device=device, dtype=torch.bfloat16, requires_grad=True)
              for _ in range(2)]
        gs = [torch.randn(s // world, b, spec.hidden, device=device, dtype=torch.bfloat16) for _ in range(2)]

        _drop_grad_after_use(xs)

        def step(i):
            stage(xs[i % 2]).backward(gs[i % 2])

        t = time_fn(step, device, warmup=3, repeats=9, max_inner=1).median_s
        tg = _graphed_layer_s(step)
        tt = torch.tensor([t, tg], device=device)
        dist.all_reduce(tt, op=dist.ReduceOp.MAX)
        pred = _layer_prediction(prof, spec, b, s, tp=world)
        rows.append(_layer_row(name, world, b, s, float(tt[0]), float(tt[1]), pred))
        stage = xs = gs = step = None  # free this case before the next (step closes over them)
        torch.cuda.empty_cache()
    return rows


def _layer_row(name, tp, b, s, eager_s, graph_s, pred) -> dict:
    """rel_error: the replayed layer, sustained (_graphed_layer_s), against the GPU time the cost model predicts
    (how the runtime runs a CUDA-graph plan); eager_rel_error: the eagerly issued layer against max(GPU, host) time (how it runs the
    rest: pipelines, MoE, fully sharded). On CPU there is no graph and rel_error is the eager one."""
    eager_err = _err(pred["total_s"], eager_s)
    row = {"model": name, "tp": tp, "micro_batch": b, "seq": s, "measured_s": eager_s, "graph_s": graph_s, **pred,
           "eager_rel_error": eager_err,
           "rel_error": _err(pred["gpu_s"], graph_s) if graph_s is not None else eager_err}
    return row


def bench_layer_tp(profile_path: str, tp: int) -> list[dict]:
    """The same layers at TP `tp` (sequence parallel, the runtime's overlap), in `tp` spawned processes."""
    from runtime.profiler.spawn import run_spawned

    return run_spawned(_tp_layer_rows, tp, True, profile_path)


def bench_layer(profile, device, out_dir, profile_path: str = "", gpus: int = 1):
    try:
        from runtime.mesh import single_process_groups
        from runtime.model import build_stage
    except Exception as exc:  # noqa: BLE001
        return {"n": 0, "note": f"runtime.model.build_stage not importable ({exc.__class__.__name__}: {exc})"}
    if device.type == "cuda":
        cases = LAYER_CASES
        specs = {n: CATALOGUE[n] for n, _, _ in cases}
        dtype = torch.bfloat16
    else:
        from planner.model import tiny_model
        specs = {"tiny-gpt": tiny_model("gpt"), "tiny-llama": tiny_model("llama")}
        cases = [("tiny-gpt", 2, 32), ("tiny-llama", 2, 32)]
        dtype = torch.float32
    rows, errs = [], []
    groups = single_process_groups()
    for name, b, s in cases:
        spec = specs[name]
        stage = build_stage(spec, groups, 0, 1, False, False, ["none"], overlap=False, device=str(device)).to(dtype)
        _as_in_training(stage, dtype)
        xs = [torch.randn(s, b, spec.hidden, device=device, dtype=dtype, requires_grad=True) for _ in range(2)]
        gs = [torch.randn(s, b, spec.hidden, device=device, dtype=dtype) for _ in range(2)]

        _drop_grad_after_use(xs)

        def step(i):
            y = stage(xs[i % 2])
            y.backward(gs[i % 2])

        t = time_fn(step, device, warmup=3, repeats=7, max_inner=1).median_s
        tg = _graphed_layer_s(step) if device.type == "cuda" else None
        pred = _layer_prediction(profile, spec, b, s)
        row = _layer_row(name, 1, b, s, t, tg, pred)
        errs.append(row["rel_error"])
        rows.append(row)
        stage = xs = gs = step = None  # free this case before the next (step closes over them)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if device.type == "cuda" and gpus >= 2 and profile_path:
        for r in bench_layer_tp(profile_path, 2):
            errs.append(r["rel_error"])
            rows.append(r)
    _csv(out_dir / "layer.csv", rows)
    st = _stats(errs, 0.05, 0.05)
    st["note"] = ("TP1 on one GPU; TP2 in two spawned processes (sequence parallel, overlapped backward); on CUDA "
                  "rel_error compares the layer replayed as a CUDA graph with the predicted GPU time, "
                  "eager_rel_error the eagerly issued layer with max(GPU, host)")
    return st


def _csv(path: Path, rows: list[dict]) -> None:
    if not rows:
        return
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profile", required=True)
    ap.add_argument("--out", required=True, help="folder for the CSV and JSON results")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--gpus", type=int, default=None)
    ap.add_argument("--gemm-shapes", type=int, default=150)
    ap.add_argument("--gemm-first", type=int, default=0, help="skip this many of the shuffled held-out shapes")
    ap.add_argument("--skip", default="", help="comma list of parts to skip: gemm,fp8,attention,collectives,layer")
    ap.add_argument("--passes", type=int, default=1,
                    help="time the held-out GEMMs and attention cases this many times (every other pass in reverse "
                         "order) and compare each case's median; the first pass alone is reported beside it")
    a = ap.parse_args(argv)
    coll.force_env()
    prof = Profile.load(Path(a.profile))
    device = torch.device("cuda", 0) if a.device == "cuda" else torch.device("cpu")
    if device.type == "cpu":
        torch.set_num_threads(1)
    gpus = a.gpus or (torch.cuda.device_count() if device.type == "cuda" else 2)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    skip = set(filter(None, a.skip.split(",")))
    summary = {"profile": a.profile, "profile_gpu": prof.gpu, "profile_date": prof.provenance.get("date"),
               "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
               "torch": torch.__version__, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "command": " ".join(["python", "benchmarks/profile_accuracy.py"] + (argv or sys.argv[1:]))}
    t0 = time.monotonic()
    for name, fn in (("gemm", lambda: bench_gemm(prof, device, a.gemm_shapes, out, a.gemm_first, a.passes)),
                     ("fp8", lambda: bench_fp8(prof, device, max(a.gemm_shapes // 3, 10), out)),
                     ("attention", lambda: bench_attention(prof, device, out, a.passes)),
                     ("collectives", lambda: bench_collectives(prof, device, gpus, out)),
                     ("layer", lambda: bench_layer(prof, device, out, a.profile, gpus))):
        if name in skip:
            continue
        summary[name] = fn()
        print(f"{name}: {json.dumps(summary[name])}", flush=True)
    summary["wall_s"] = round(time.monotonic() - t0, 1)
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"wrote {out}/summary.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
