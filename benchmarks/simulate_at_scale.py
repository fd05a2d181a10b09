"""Simulate the planner's own plans at scale: each case is planned by the search (`plan --model M --gpus N ... -o`),
chosen ranks of it are built and stepped under the fake process group (`python -m runtime.simulate PLAN --ranks ...
--json`), and benchmarks/results/simulation/ receives per plan `<case>.plan.json` and `<case>.json`, and over
every case simulated so far `summary.json`, `provenance.json` and the table in its README.md.

    python benchmarks/simulate_at_scale.py [--only CASE,CASE] [--ranks CASE=R,R ...] [--jobs 1] [--nice 19]
                                           [--summary-only]

Ranks: by default the first rank of the first and of the last pipeline stage (the ends: embedding, head, tied
embedding), which bounds the time; `--ranks CASE=all` or a list runs others. Each simulated rank costs about 50 s
of CPU for a 70B-class pipeline rank of 64 micro-batches (benchmarks/results/simulation/), so the cases
carry a global batch that keeps their micro-batches per step near the pipeline's depth where the model's default
would take hours."""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "simulation"
MODELS = ROOT / "benchmarks" / "models"
TABLE_START, TABLE_END = "<!-- simulate_at_scale table -->", "<!-- end of table -->"
UNPRICED_BYTES = 1e6
"""A collective the cost model does not price counts as wholly wrong once it moves more than this per step
(the loss's and the gradient norm's scalars are not priced and move bytes)."""


@dataclass(frozen=True)
class Case:
    """One plan of the list: its name, the `plan` arguments that make it and what it covers."""
    name: str
    gpus: int
    args: tuple
    covers: str
    ranks: str | None = None
    """--ranks for the simulation; None: the first ranks of the first and last pipeline stage; "roles": the
    command's default, one rank of each role (every pipeline stage)."""
    steps: int = 1
    """Steps per rank, the last traced (runtime.simulate --steps)."""


def _c(name, gpus, covers, *args, ranks=None, steps=1) -> Case:
    return Case(name, gpus, tuple(args), covers, ranks, steps)


DSV3 = str(MODELS / "deepseek-v3-sized" / "config.json")
LLAMA31_70B = str(MODELS / "llama3.1-70b" / "config.json")  # llama3-70b's layers with Llama 3.1's 128K context
CASES: list[Case] = [
    _c("gpt-70b-64gpu", 64, "the 10-minute bar's plan, every pipeline stage", "--model", "gpt-70b",
       ranks="roles"),
    _c("gpt-13b-64gpu-none", 64, "recompute none", "--model", "gpt-13b", "--recompute", "none", "--pp", "2",
       "--global-batch", "128"),
    _c("gpt-13b-64gpu-selective", 64, "recompute selective", "--model", "gpt-13b", "--recompute", "selective",
       "--pp", "2", "--global-batch", "128"),
    _c("gpt-13b-64gpu-full", 64, "recompute full", "--model", "gpt-13b", "--recompute", "full", "--pp", "2",
       "--global-batch", "128"),
    _c("gpt-13b-64gpu-fsdp", 64, "FSDP (sharding full)", "--model", "gpt-13b", "--sharding", "full",
       "--global-batch", "128"),
    _c("gpt-13b-64gpu-zero2", 64, "ZeRO-2 under a pipeline", "--model", "gpt-13b", "--sharding", "optimizer+grads",
       "--pp", "2", "--global-batch", "128"),
    _c("llama3-8b-64gpu-a100", 64, "an A100 plan", "--model", "llama3-8b", "--gpu", "a100-80gb",
       "--global-batch", "128"),
    _c("gpt-70b-128gpu-h100", 128, "an H100 plan", "--model", "gpt-70b", "--gpu", "h100-sxm", "--global-batch", "256"),
    _c("llama3-70b-128gpu-fp8", 128, "FP8", "--model", "llama3-70b", "--fp8", "--global-batch", "128"),
    _c("llama3-70b-128gpu-vpp", 128, "interleaved at the largest virtual-stage count", "--model", "llama3-70b",
       "--pp", "4", "--vpp", "20", "--global-batch", "128"),
    _c("mixtral-8x7b-64gpu-ep", 64, "MoE with EP", "--model", "mixtral-8x7b", "--ep", "8", "--global-batch", "128"),
    _c("mixtral-8x7b-256gpu-ep", 256, "MoE with EP", "--model", "mixtral-8x7b", "--ep", "8", "--global-batch", "256"),
    _c("mixtral-8x22b-128gpu-ep", 128, "MoE with EP", "--model", "mixtral-8x22b", "--ep", "8",
       "--global-batch", "128"),
    _c("mixtral-8x22b-512gpu-ep", 512, "MoE with EP", "--model", "mixtral-8x22b", "--ep", "8",
       "--global-batch", "512"),
    _c("llama3-70b-256gpu-cp", 256, "context parallel at 32K tokens", "--model", LLAMA31_70B, "--seq-len",
       "32768", "--cp", "4", "--global-batch", "64"),
    _c("llama3-70b-1024gpu-cp", 1024, "context parallel at 32K tokens", "--model", LLAMA31_70B, "--seq-len",
       "32768", "--cp", "8", "--global-batch", "128"),
    _c("llama3-405b-1024gpu", 1024, "405B", "--model", "llama3-405b", "--global-batch", "256"),
    _c("llama3-405b-16384gpu", 16384, "405B at the largest world", "--model", "llama3-405b", "--global-batch", "2048"),
    _c("deepseek-v3-sized-2048gpu-ep64", 2048, "a DeepSeek-V3-sized MoE at EP 64", "--model", DSV3, "--ep", "64",
       "--global-batch", "512"),
    _c("gpt-175b-1024gpu", 1024, "175B", "--model", "gpt-175b", "--global-batch", "512"),
    _c("llama3-8b-256gpu", 256, "a small model wide", "--model", "llama3-8b", "--global-batch", "512"),
    _c("gpt-6.7b-64gpu-bf16-grads", 64, "bf16 gradients", "--model", "gpt-6.7b", "--grad-dtype", "bf16",
       "--global-batch", "128"),
    _c("llama3-70b-512gpu", 512, "70B at 512", "--model", "llama3-70b", "--global-batch", "256"),
    _c("gpt-70b-256gpu-fsdp", 256, "FSDP at 70B", "--model", "gpt-70b", "--sharding", "full", "--global-batch", "256"),
]


def _run(cmd: list[str], nice: int, timeout: float | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(["nice", "-n", str(nice)] + cmd, capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=timeout)


def make_plan(case: Case, nice: int) -> Path:
    """The case's plan from the planner's own search (kept when already made)."""
    path = OUT / f"{case.name}.plan.json"
    if not path.exists():
        cmd = [sys.executable, "-c", "import sys; from planner.cli import main; sys.exit(main())",
               "--gpus", str(case.gpus), *case.args, "-o", str(path), "--force"]
        out = _run(cmd, nice)
        if out.returncode != 0:
            raise RuntimeError(f"{case.name}: the planner found no plan: {(out.stderr or out.stdout).strip()[-300:]}")
    return path


def default_ranks(plan_path: Path) -> str:
    """The first rank of the first and of the last pipeline stage (ranks are pipeline-major)."""
    lay = json.loads(plan_path.read_text())["layout"]
    per_stage = lay["tp"] * lay["cp"] * lay["dp"]
    return ",".join(str(r) for r in sorted({0, (lay["pp"] - 1) * per_stage}))


def simulate(case: Case, plan_path: Path, ranks: str, jobs: int, nice: int) -> dict:
    """The simulation's JSON object for the case, with its wall and the command's outcome."""
    # "roles": the command's own default, one rank of each role (every pipeline stage, an expert rank)
    rank_args = [] if ranks == "roles" else ["--ranks", ranks]
    cmd = [sys.executable, "-m", "runtime.simulate", str(plan_path), *rank_args, "--json", "--jobs", str(jobs),
           "--steps", str(case.steps)]
    t0 = time.perf_counter()
    out = _run(cmd, nice)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        return {"case": case.name, "covers": case.covers, "ranks_asked": ranks, "built": False, "wall_s": wall,
                "error": (out.stderr or out.stdout).strip().splitlines()[-1:]}
    obj = json.loads(out.stdout)
    obj.update(case=case.name, covers=case.covers, ranks_asked=ranks, steps=case.steps, built=True, wall_s=wall,
               plan=str(plan_path.relative_to(ROOT)))
    return obj


def rank_errors(entry: dict) -> tuple[float, float]:
    """(traced tensors over predicted - 1, the worst relative error of a collective's bytes per (kind, group))."""
    mem_err = entry["traced_tensor_gib"] / entry["predicted_tensor_gib"] - 1
    worst = 0.0
    for c in entry["collectives"]:
        p, t = c["predicted_bytes"], c["traced_bytes"]
        if p:
            worst = max(worst, abs(t / p - 1))
        elif t > UNPRICED_BYTES:
            worst = max(worst, 1.0)
    return mem_err, worst


def _sharding(res: dict) -> str:
    return json.loads((ROOT / res["plan"]).read_text())["layout"]["sharding"]


def memory_figures(ranks: list[dict]) -> dict:
    """Median and worst |traced / predicted - 1| of the ranks' tensors, and the largest share traced over."""
    errs = [rank_errors(r)[0] for r in ranks]
    return {"memory_median_abs_err": statistics.median(abs(e) for e in errs) if errs else None,
            "memory_worst_abs_err": max((abs(e) for e in errs), default=None),
            "memory_worst_under": max(errs, default=None)}


def summary(results: list[dict], commit: str, date: str) -> dict:
    """summary.json over the simulated cases (the keys of issue 40's bars); the memory figures also without the
    FSDP ('sharding full') cases, whose simulation does not yet classify FSDP2's storages."""
    ranks = [r for res in results if res.get("built") for r in res["ranks"]]
    errs = [rank_errors(r) for r in ranks]
    no_fsdp = [r for res in results if res.get("built") and _sharding(res) != "full" for r in res["ranks"]]
    return {
        "plans": len(CASES), "simulated": len(results), "built": sum(1 for r in results if r.get("built")),
        "ranks": len(ranks),
        "largest_world": max((r["world_size"] for r in results if r.get("built")), default=0),
        **memory_figures(ranks),
        "without_fsdp": {"ranks": len(no_fsdp), **memory_figures(no_fsdp)},
        "comm_bytes_worst_abs_err": max((c for _, c in errs), default=None),
        "seconds_median": statistics.median(r["seconds"] for r in ranks) if ranks else None,
        "cpu_seconds_median": statistics.median(r["cpu_seconds"] for r in ranks) if ranks else None,
        "not_simulated": [c.name for c in CASES if c.name not in {r["case"] for r in results}],
        "commit": commit, "date": date,
    }


def table(results: list[dict]) -> str:
    """The README's table: one row per simulated rank."""
    rows = ["| case | covers | layout | world | rank (stage) | predicted GiB | traced GiB | error | worst comm error "
            "| CPU s |", "|---|---|---|---|---|---|---|---|---|---|"]
    for res in results:
        if not res.get("built"):
            rows.append(f"| {res['case']} | {res['covers']} | - | - | {res['ranks_asked']} | - | - | not built: "
                        f"{' '.join(res.get('error', []))[:120]} | - | - |")
            continue
        for r in res["ranks"]:
            m, c = rank_errors(r)
            rows.append(f"| {res['case']} | {res['covers']} | {res['layout']} | {res['world_size']} | {r['rank']} "
                        f"({r['stage']}) | {r['predicted_tensor_gib']:.2f} | {r['traced_tensor_gib']:.2f} | "
                        f"{100 * m:+.2f}% | {100 * c:.2f}% | {r['cpu_seconds']:.0f} |")
    return "\n".join(rows)


def _machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} CPU cores"


def write_outputs(argv: list[str]) -> dict:
    """summary.json, provenance.json and the README table over every `<case>.json` in the results folder."""
    results = [json.loads((OUT / f"{c.name}.json").read_text()) for c in CASES if (OUT / f"{c.name}.json").exists()]
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    s = summary(results, commit, date)
    (OUT / "summary.json").write_text(json.dumps(s, indent=1) + "\n")
    command = "python benchmarks/simulate_at_scale.py " + " ".join(argv)
    old = json.loads((OUT / "provenance.json").read_text()) if (OUT / "provenance.json").exists() else {}
    # every invocation whose results are still there: a run of every case (no --only) supersedes the earlier ones
    full_run = not any(a.startswith("--only") or a.startswith("--summary-only") for a in argv)
    runs = [] if full_run else [r for r in old.get("runs", []) if r.get("command") != command]
    runs.append({"command": command, "commit": commit, "date": date})
    prov = {"command": command, "commit": commit, "machine": _machine(), "date": date, "runs": runs}
    (OUT / "provenance.json").write_text(json.dumps(prov, indent=1) + "\n")
    readme = OUT / "README.md"
    text = readme.read_text() if readme.exists() else "# Simulation of plans' ranks\n"
    block = f"{TABLE_START}\n{table(results)}\n{TABLE_END}"
    if TABLE_START in text:
        text = text[:text.index(TABLE_START)] + block + text[text.index(TABLE_END) + len(TABLE_END):]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    readme.write_text(text)
    return s


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default=None, help="comma-separated case names (default: every case)")
    ap.add_argument("--ranks", action="append", default=[], help="CASE=all or CASE=R,R (default: the two ends)")
    ap.add_argument("--jobs", type=int, default=1, help="ranks simulated at once (default 1)")
    ap.add_argument("--nice", type=int, default=19, help="niceness of the planner and simulation processes")
    ap.add_argument("--summary-only", action="store_true", help="rewrite summary, provenance and table only")
    ap.add_argument("--list", action="store_true", help="print the cases and exit")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.list:
        for c in CASES:
            print(f"{c.name:34} {c.gpus:>6}  {c.covers}")
        return 0
    names = {c.name for c in CASES}
    only = args.only.split(",") if args.only else [c.name for c in CASES]
    unknown = [n for n in only if n not in names]
    if unknown:
        print(f"error: unknown case(s) {', '.join(unknown)}; --list names them", file=sys.stderr)
        return 2
    ranks = dict(r.split("=", 1) for r in args.ranks)
    OUT.mkdir(parents=True, exist_ok=True)
    for case in ([] if args.summary_only else [c for c in CASES if c.name in only]):
        plan_path = make_plan(case, args.nice)
        res = simulate(case, plan_path, ranks.get(case.name) or case.ranks or default_ranks(plan_path), args.jobs,
                       args.nice)
        (OUT / f"{case.name}.json").write_text(json.dumps(res, indent=1) + "\n")
        print(f"{case.name}: {'built' if res['built'] else 'NOT built'} in {res['wall_s']:.0f} s", flush=True)
    print(json.dumps(write_outputs(argv), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
