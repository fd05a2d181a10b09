"""Three bars of the pipeline, context and expert layers on two GPUs (PP2 bubble, CP2 scaling at 32k, EP2 MoE vs dense), in one run.

    python benchmarks/parallel_bars.py --out DIR                     # 2 GPUs, CUDA + NCCL
    python benchmarks/parallel_bars.py --out DIR --device cpu --tiny # plumbing check: tiny models, gloo

Writes exactly two files under --out: parallel_bars.jsonl (one JSON object per line: meta, the plans,
every measured step, per-run summaries, exposed-communication profiles, the three bars) and
parallel_bars.log (everything the workers printed, then the summary table). Plans are built with
planner.plan (Plan / Layout / even_stages) and embedded in the JSONL ("kind": "plan"); pass
--plans-dir to also keep them as files (kept off --out by default: the GPU machine returns few files).

Every measurement runs `python -m torch.distributed.run` on this file's --worker mode, which is
runtime/train.py's loop (build_groups, build_rank_stages, build_optimizer, select_train_step, the same
synthetic micro-batches) plus what the bars need:

(a) PP2, gpt-1.3b, 1F1B and interleaved (vpp 2), m = 8 micro-batches. Every step records the
    pipeline's action timeline (runtime.parallel.pipeline.last_timeline, gathered with gather_timeline).
    Times are GPU times: the runtime's _Clock records CUDA events on the compute stream (start mark after
    the input's receive has been waited on, so a span is the action's compute, not its wait for the
    neighbour), converted after the step's synchronize; the origin is an event after a barrier over the
    pipeline group. Reported per step: measured_bubble_fraction(timeline); the planner's
    CostModel(...).predict(stages).breakdown_s['bubble'] / step_s and / (pipeline part of step_s); and
    analytic_bubble_fraction(t_r) with t_r = this step's measured per-rank busy time / m.
(b) CP2 at 32768 tokens, Llama-style GQA (16 layers, 2048, 16 heads, 4 KV, ffn 5632): tokens/s per GPU of
    CP2 on 2 GPUs against CP1 on one GPU (micro-batch 1, one sequence per step). Exposed ring
    communication from a torch.profiler trace of one extra step: NCCL kernel time on each GPU not
    overlapped by any non-NCCL kernel (memcpy/memset count as compute), split into point-to-point
    (SendRecv kernels: the ring) and other collectives (gradient reduce-scatter, all-reduces).
(c) EP2 x DP2, 8 experts top-2 (8 layers, 2048, 16 heads, 4 KV, expert ffn 2816, seq 4096) against the
    dense model of the same active parameters (ffn 5632) on one GPU, same sequences per GPU. Exposed
    all-to-all from the same kind of profile (NCCL all_to_all_single runs as SendRecv kernels).

Timing of tokens/s is train.py's: synchronize, perf_counter around train_step, synchronize; median over
the steps after --warmup. The profiled step is separate and not in the median.
Environment of every process: NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

for _k, _v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ[_k] = _v

from benchmarks.parallel_bars_worker import worker  # noqa: E402  (this file's --worker mode, under torchrun)

BARS = {"pp_points": 2.0, "cp_eff": 0.85, "ep_eff": 0.80}


# ------------------------------------------------------------------------------------------------
# plans

def _specs(tiny: bool):
    from planner.model import CATALOGUE, ModelSpec, tiny_model
    if tiny:
        gpt = tiny_model("gpt", num_layers=4)
        cp = tiny_model("llama", name="tiny-llama-cp", num_layers=2, max_seq_len=64, default_seq_len=64)
        moe = tiny_model("llama", name="tiny-moe", num_layers=2, ffn_hidden=64, num_experts=8, top_k=2)
        dense = tiny_model("llama", name="tiny-moe-dense", num_layers=2, ffn_hidden=128)
        return dict(pp=(gpt, 32, 1), cp=(cp, 64), ep=(moe, dense, 32, 1, 2))
    gpt = CATALOGUE["gpt-1.3b"]
    cp = ModelSpec("llama-16l-2048-gqa-32k", "llama", 16, 2048, 16, 4, 5632, 32000, 32768, 32768, 1)
    moe = ModelSpec("moe-8x2816-top2", "llama", 8, 2048, 16, 4, 2816, 32000, 4096, 4096, 16, num_experts=8, top_k=2)
    dense = ModelSpec("dense-5632-same-active", "llama", 8, 2048, 16, 4, 2 * 2816, 32000, 4096, 4096, 8)
    # pp: (spec, seq, micro-batch); ep: (moe, dense, seq, micro-batch, micro-batches per GPU)
    return dict(pp=(gpt, 2048, 2), cp=(cp, 32768), ep=(moe, dense, 4096, 2, 4))


def build_plans(tiny: bool, m: int) -> dict:
    from planner.cluster import ClusterSpec
    from dataclasses import replace

    from planner.plan import Layout, Plan, TrainingShape, even_stages
    s = _specs(tiny)

    def plan(spec, seq, gb, lay, stages, note):
        if lay.dp * lay.cp == 1:   # nothing to shard the optimizer over
            lay = replace(lay, sharding="none")
        cl = ClusterSpec(gpu="h200-sxm", num_gpus=lay.world_size, gpus_per_node=lay.world_size)
        p = Plan(model=spec, cluster=cl.to_dict(), training=TrainingShape(seq, gb), layout=lay, stages=stages,
                 provenance={"written_by": "benchmarks/parallel_bars.py", "note": note})
        return Plan.from_dict(p.to_dict())   # runs the legality checks

    gpt, pseq, pmb = s["pp"]
    cp, cseq = s["cp"]
    moe, dense, eseq, emb, em = s["ep"]
    L = gpt.num_layers
    return {
        "pp2-1f1b": plan(gpt, pseq, pmb * m, Layout(pp=2, vpp=1, micro_batch=pmb), even_stages(L, 2), "PP2 1F1B"),
        "pp2-vpp2": plan(gpt, pseq, pmb * m, Layout(pp=2, vpp=2, micro_batch=pmb), even_stages(L, 4),
                         "PP2 interleaved, 2 virtual stages per rank"),
        "cp1": plan(cp, cseq, 1, Layout(cp=1, micro_batch=1), even_stages(cp.num_layers, 1), "CP1 one GPU"),
        "cp2": plan(cp, cseq, 1, Layout(cp=2, micro_batch=1), even_stages(cp.num_layers, 1), "CP2 two GPUs"),
        "dense1": plan(dense, eseq, emb * em, Layout(micro_batch=emb), even_stages(dense.num_layers, 1),
                       "dense, same active parameters, one GPU"),
        "moe1": plan(moe, eseq, emb * em, Layout(micro_batch=emb), even_stages(moe.num_layers, 1),
                     "MoE on one GPU (all experts local, no all-to-all): splits the EP2 gap into the MoE's own "
                     "compute and the dispatch over the EP group"),
        "ep2dp2": plan(moe, eseq, 2 * emb * em, Layout(dp=2, ep=2, micro_batch=emb), even_stages(moe.num_layers, 1),
                       "MoE EP2 x DP2 two GPUs"),
    }


def planner_bubble(plan) -> dict:
    from planner.cluster import ClusterSpec
    from planner.cost import CostModel
    from planner.profile import load_profile
    prof = load_profile(None, "h200-sxm")
    cm = CostModel(plan.model, plan.training, plan.layout, ClusterSpec.from_dict(plan.cluster), prof)
    pred = cm.predict(plan.stages)
    b = pred.breakdown_s
    pipe = pred.step_s - b.get("dp_comm", 0.0) - b.get("optimizer", 0.0)
    return dict(step_s=pred.step_s, bubble_s=b["bubble"], pipeline_s=pipe,
                bubble_over_step=b["bubble"] / pred.step_s, bubble_over_pipeline=b["bubble"] / pipe,
                breakdown_s=b, profile=str(prof.source) if hasattr(prof, "source") else "h200-sxm (shipped)")


class Log:
    def __init__(self, path):
        self.f = open(path, "a")

    def __call__(self, msg=""):
        print(msg, flush=True)
        self.f.write(msg + "\n")
        self.f.flush()


def run_worker(tag, plan_path, nproc, args, tmp, log, deadline, gpus=None) -> list[dict]:
    record = os.path.join(tmp, f"{tag}.jsonl")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           str(Path(__file__).resolve()), "--worker", "--plan", str(plan_path), "--tag", tag, "--record", record,
           "--device", args.device, "--steps", str(args.steps), "--warmup", str(args.warmup),
           "--profile-steps", str(args.profile_steps if not tag.startswith("pp") else 0), "--tmp", tmp]
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    if args.device == "cpu":
        env.setdefault("OMP_NUM_THREADS", "1")
    elif gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpus
    left = deadline - time.monotonic()
    limit = min(args.run_timeout, left)
    log(f"== {tag}: {nproc} process(es), timeout {limit:.0f}s: {' '.join(cmd)}")
    if limit < 20:
        log(f"!! {tag}: skipped, the run's time budget is spent")
        return [dict(run=tag, kind="error", error="skipped: time budget spent")]
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=limit,
                           cwd=str(ROOT))
        out, rc = p.stdout, p.returncode
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        rc = "timeout"
    log.f.write(out)
    log.f.flush()
    lines = [ln for ln in out.splitlines() if ln.startswith(f"[{tag}]")]
    for ln in lines[-3:]:
        print(ln, flush=True)
    log(f"== {tag}: rc {rc} in {time.monotonic() - t0:.1f}s")
    recs = []
    if os.path.exists(record):
        recs = [json.loads(ln) for ln in open(record) if ln.strip()]
    if rc != 0:
        tail = "\n".join(out.splitlines()[-15:])
        print(tail, flush=True)
        recs.append(dict(run=tag, kind="error", error=f"rc {rc}", tail=tail))
    return recs


def _median(recs, key):
    vals = [r[key] for r in recs if r.get("kind") == "step" and r.get("timed") and r.get(key) is not None]
    return statistics.median(vals) if vals else None


def summarise(tag, recs, world):
    steps = [r for r in recs if r.get("kind") == "step" and r.get("timed")]
    out = dict(kind="run_summary", run=tag, world=world, timed_steps=len(steps),
               step_s_median=_median(recs, "step_s"), tokens_per_s_per_gpu_median=_median(recs, "tokens_per_s_per_gpu"),
               peak_mem_gib_max=max((r["peak_mem_gib_max"] for r in steps), default=None))
    for k in ("bubble_measured", "bubble_analytic_measured_t", "pipeline_span_s"):
        if any(k in r for r in steps):
            out[k + "_median"] = _median(recs, k)
    prof = [r for r in recs if r.get("kind") == "profile"]
    if prof:
        pr = prof[-1]["per_rank"]
        out["profile_method"] = pr[0]["method"]
        for k in ("p2p_total_s", "p2p_exposed_s", "coll_total_s", "coll_exposed_s", "comm_exposed_s", "gpu_idle_s"):
            out[k + "_max_rank"] = max(x[k] for x in pr)
        prof_steps = [r for r in recs if r.get("kind") == "step" and r.get("profiled")]
        if prof_steps:
            out["profiled_step_s"] = statistics.median(r["step_s"] for r in prof_steps)
    return out


def _gpu_names() -> list[str]:
    """From nvidia-smi, so that this parent process holds no CUDA context while the workers run."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30).stdout
        return [ln.strip() for ln in out.splitlines() if ln.strip()]
    except (OSError, subprocess.SubprocessError):
        return []


def driver(args) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    jsonl, logp = out / "parallel_bars.jsonl", out / "parallel_bars.log"
    for p in (jsonl, logp):
        if p.exists():
            p.unlink()
    log = Log(logp)
    deadline = time.monotonic() + args.budget_s
    T0 = time.monotonic()
    tmp = tempfile.mkdtemp(prefix="parallel_bars-")
    plans_dir = Path(args.plans_dir) if args.plans_dir else Path(tmp) / "plans"
    plans_dir.mkdir(parents=True, exist_ok=True)
    records = []

    def put(r):
        records.append(r)
        with open(jsonl, "a") as f:
            f.write(json.dumps(r) + "\n")

    import torch
    meta = dict(kind="meta", date=datetime.datetime.now().isoformat(timespec="seconds"), device=args.device,
                tiny=args.tiny, torch=torch.__version__, cuda=torch.version.cuda,
                gpus=_gpu_names() if args.device == "cuda" else [],
                steps=args.steps, warmup=args.warmup, profile_steps=args.profile_steps, micro_batches_pp=args.m,
                env={k: os.environ.get(k) for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")},
                timeline_clock="CUDA events on the compute stream (runtime.parallel.pipeline._Clock), start mark after "
                               "the input receive's wait" if args.device == "cuda" else "host perf_counter (CPU)",
                exposed_comm_method="torch.profiler trace: NCCL kernel time not overlapped by non-NCCL kernels"
                                    if args.device == "cuda" else "host spans of gloo c10d ops")
    from planner.provenance import git_commit
    meta.update(git_commit(dirty_paths=("runtime", "planner")))
    put(meta)
    log(f"parallel_bars: {json.dumps({k: meta[k] for k in ('device', 'tiny', 'torch', 'cuda', 'gpus')})}")

    plans = build_plans(args.tiny, args.m)
    for name, p in plans.items():
        path = plans_dir / f"{name}.json"
        p.save(path, overwrite=True)
        put(dict(kind="plan", run=name, path=str(path), plan=p.to_dict()))

    only = set(args.only.split(",")) if args.only else {"pp", "cp", "ep"}
    runs = [("pp2-1f1b", 2, "pp"), ("pp2-vpp2", 2, "pp"), ("cp1", 1, "cp"), ("cp2", 2, "cp"),
            ("dense1", 1, "ep"), ("moe1", 1, "ep"), ("ep2dp2", 2, "ep")]
    summ = {}
    for tag, nproc, bar in runs:
        if bar not in only:
            continue
        if nproc > args.gpus:
            log(f"-- {tag}: skipped, it needs {nproc} GPUs and --gpus is {args.gpus}")
            put(dict(kind="skipped", run=tag, why=f"needs {nproc} GPUs, --gpus {args.gpus}"))
            continue
        recs = run_worker(tag, plans_dir / f"{tag}.json", nproc, args, tmp, log, deadline)
        for r in recs:
            put(r)
        s = summarise(tag, recs, nproc)
        if bar == "pp":
            try:
                s["planner"] = planner_bubble(plans[tag])
            except Exception as exc:  # noqa: BLE001 - the measurement stands without the prediction
                s["planner_error"] = repr(exc)
        put(s)
        summ[tag] = s

    # ---- bars
    rows = []

    def pts(a, b):
        return None if a is None or b is None else 100.0 * (a - b)

    for tag in ("pp2-1f1b", "pp2-vpp2"):
        s = summ.get(tag)
        if not s:
            continue
        meas = s.get("bubble_measured_median")
        pl = s.get("planner", {})
        d_sched = pts(meas, s.get("bubble_analytic_measured_t_median"))
        d_step = pts(meas, pl.get("bubble_over_step"))
        d_pipe = pts(meas, pl.get("bubble_over_pipeline"))
        ok = d_step is not None and abs(d_step) <= BARS["pp_points"]
        bar = dict(kind="bar", bar=f"PP2 bubble {tag}", measured=meas, planner_bubble_over_step=pl.get("bubble_over_step"),
                   planner_bubble_over_pipeline=pl.get("bubble_over_pipeline"),
                   analytic_with_measured_t_r=s.get("bubble_analytic_measured_t_median"),
                   diff_points_vs_planner_step=d_step, diff_points_vs_planner_pipeline=d_pipe,
                   diff_points_vs_analytic_measured_t=d_sched, threshold_points=BARS["pp_points"], passed=ok,
                   passed_vs_analytic_measured_t=d_sched is not None and abs(d_sched) <= BARS["pp_points"])
        put(bar)
        f = lambda x: "n/a" if x is None else f"{100 * x:.2f}%"  # noqa: E731
        g = lambda x: "n/a" if x is None else f"{x:+.2f}"  # noqa: E731
        rows.append((f"PP2 bubble {tag}",
                     f"measured {f(meas)} | planner {f(pl.get('bubble_over_step'))} (/step; {f(pl.get('bubble_over_pipeline'))} /pipe) "
                     f"d {g(d_step)} pt | formula(meas t_r) {f(s.get('bubble_analytic_measured_t_median'))} d {g(d_sched)} pt",
                     "<= 2 pt", "PASS" if ok else "FAIL"))

    def eff_bar(name, multi, single, thr, comm_key, what):
        a, b = summ.get(multi), summ.get(single)
        if not a or not b:
            return
        ta, tb = a.get("tokens_per_s_per_gpu_median"), b.get("tokens_per_s_per_gpu_median")
        eff = ta / tb if ta and tb else None
        ok = eff is not None and eff >= thr
        exp = a.get(comm_key + "_max_rank")
        prof_step = a.get("profiled_step_s")
        bar = dict(kind="bar", bar=name, tokens_per_s_per_gpu=ta, baseline_tokens_per_s_per_gpu=tb, efficiency=eff,
                   threshold=thr, passed=ok, exposed_comm_s=exp, exposed_comm_what=what,
                   exposed_comm_fraction_of_profiled_step=(exp / prof_step) if exp is not None and prof_step else None,
                   comm_total_s=a.get(comm_key.replace("exposed", "total") + "_max_rank"),
                   all_nccl_exposed_s=a.get("comm_exposed_s_max_rank"), gpu_idle_s=a.get("gpu_idle_s_max_rank"),
                   profile_method=a.get("profile_method"))
        put(bar)
        e = "n/a" if eff is None else f"{100 * eff:.1f}%"
        x = "n/a" if exp is None else f"{1e3 * exp:.2f} ms/step" + (f" ({100 * exp / prof_step:.1f}% of step)" if prof_step else "")
        tat = "n/a" if ta is None else f"{ta:.0f}"
        tbt = "n/a" if tb is None else f"{tb:.0f}"
        rows.append((name, f"{tat} vs {tbt} tok/s/GPU = {e} | exposed {what}: {x}", f">= {100 * thr:.0f}%",
                     "PASS" if ok else "FAIL"))

    eff_bar("CP2 scaling (seq %d)" % plans["cp2"].training.seq_len, "cp2", "cp1", BARS["cp_eff"], "p2p_exposed_s", "ring")
    eff_bar("EP2xDP2 MoE vs dense", "ep2dp2", "dense1", BARS["ep_eff"], "p2p_exposed_s", "all-to-all")
    # not a bar: the same MoE on one GPU, so the EP2 shortfall splits into the MoE's own cost and its dispatch
    a, b = summ.get("moe1"), summ.get("dense1")
    if a and b and a.get("tokens_per_s_per_gpu_median") and b.get("tokens_per_s_per_gpu_median"):
        r = a["tokens_per_s_per_gpu_median"] / b["tokens_per_s_per_gpu_median"]
        put(dict(kind="diagnostic", what="MoE one GPU vs dense one GPU", ratio=r))
        rows.append(("MoE 1 GPU vs dense", f"{a['tokens_per_s_per_gpu_median']:.0f} vs "
                     f"{b['tokens_per_s_per_gpu_median']:.0f} tok/s/GPU = {100 * r:.1f}% (no all-to-all)", "(info)", ""))

    log("")
    log(f"{'bar':<28} {'result':<110} {'need':<8} verdict")
    for r in rows:
        log(f"{r[0]:<28} {r[1]:<110} {r[2]:<8} {r[3]}")
    errs = [r for r in records if r.get("kind") == "error"]
    log(f"total {time.monotonic() - T0:.0f}s; {len(errs)} run error(s); results in {jsonl}")
    if not args.plans_dir:
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if errs else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="folder for parallel_bars.jsonl and parallel_bars.log")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--tiny", action="store_true", help="tiny models (CPU plumbing check)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps per run (after --warmup)")
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--profile-steps", type=int, default=1, help="extra profiled steps for exposed communication")
    ap.add_argument("--m", type=int, default=8, help="pipeline micro-batches")
    ap.add_argument("--only", default="", help="comma list of pp, cp, ep (default all)")
    ap.add_argument("--gpus", type=int, default=2, help="GPUs on this machine: runs that need more are skipped")
    ap.add_argument("--budget-s", type=float, default=460.0, help="wall budget for all runs; later runs are skipped")
    ap.add_argument("--run-timeout", type=float, default=150.0, help="timeout of one torchrun")
    ap.add_argument("--plans-dir", default=None, help="also keep the plan files here (default: a temp folder)")
    # worker
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--plan", help=argparse.SUPPRESS)
    ap.add_argument("--tag", help=argparse.SUPPRESS)
    ap.add_argument("--record", help=argparse.SUPPRESS)
    ap.add_argument("--tmp", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.steps is None:
        args.steps = 3 if args.tiny else 6
    if args.warmup is None:
        args.warmup = 1 if args.tiny else 3
    if args.worker:
        return worker(args)
    if not args.out:
        ap.error("--out is required")
    return driver(args)


if __name__ == "__main__":
    sys.exit(main())
