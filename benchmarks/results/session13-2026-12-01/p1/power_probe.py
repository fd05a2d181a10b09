"""Session 13 probe: burst (profiler-style) against sustained kernel and layer times on one H200, with power and
clocks logged by nvidia-smi beside it. Each workload: 1 s idle, a profiler-style burst timing, then ~3 s
back-to-back with an event every iteration, then the burst timing again (hot)."""
import json, sys, time
import torch
sys.path.insert(0, ".")
from benchmarks.profile_accuracy import LAYER_CASES, _as_in_training, _drop_grad_after_use
from planner.model import CATALOGUE
from runtime.mesh import single_process_groups
from runtime.model import build_stage
from runtime.profiler.timing import time_fn

dev = torch.device("cuda")
out = sys.argv[1]
rows = []


def sustained(name, fn, seconds=3.0, graph=None):
    torch.cuda.synchronize(); time.sleep(1.0)
    burst_cold = time_fn(fn, dev, warmup=2, repeats=7).median_s
    torch.cuda.synchronize()
    evs = []
    t_start = time.time()
    torch.cuda.synchronize()
    i = 0
    while time.time() - t_start < seconds:
        a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
        a.record(); fn(i); b.record(); evs.append((a, b)); i += 1
        if i % 64 == 0:
            evs[-1][1].synchronize()  # keep the queue short so wall time tracks GPU time
    torch.cuda.synchronize()
    ts = [a.elapsed_time(b) / 1e3 for a, b in evs]
    burst_hot = time_fn(fn, dev, warmup=2, repeats=7).median_s
    n = len(ts)
    def med(xs):
        xs = sorted(xs); return xs[len(xs) // 2]
    # time-resolved: medians over tenths of the run
    tenth = [med(ts[k * n // 10:(k + 1) * n // 10]) for k in range(10)] if n >= 10 else ts
    row = {"name": name, "t0_unix": t_start, "iters": n, "burst_cold_s": burst_cold, "burst_hot_s": burst_hot,
           "first5_s": med(ts[:5]), "last_half_s": med(ts[n // 2:]), "tenths_s": tenth}
    print(json.dumps(row), flush=True)
    rows.append(row)


def gemm(m, n, k):
    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    w = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
    return lambda i: torch.nn.functional.linear(x, w)


for (m, n, k) in [(4096, 20480, 5120), (8192, 8192, 2048), (8192, 2048, 2048), (4096, 5120, 5120),
                  (8192, 14336, 4096)]:
    sustained(f"gemm {m}x{n}x{k}", gemm(m, n, k))
big = torch.empty(2**28, device=dev, dtype=torch.float32); big2 = torch.empty_like(big)
sustained("copy 1 GiB", lambda i: big2.copy_(big))
del big, big2

groups = single_process_groups()
for name, b, s in LAYER_CASES:
    spec = CATALOGUE[name]
    stage = build_stage(spec, groups, 0, 1, False, False, ["none"], overlap=False, device="cuda").to(torch.bfloat16)
    _as_in_training(stage, torch.bfloat16)
    xs = [torch.randn(s, b, spec.hidden, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(2)]
    gs = [torch.randn(s, b, spec.hidden, device=dev, dtype=torch.bfloat16) for _ in range(2)]
    _drop_grad_after_use(xs)
    def step(i):
        stage(xs[i % 2]).backward(gs[i % 2])
    for _ in range(3):
        step(0)
    torch.cuda.synchronize()
    sustained(f"layer {name} eager", step)
    g = torch.cuda.CUDAGraph()
    st = torch.cuda.Stream(); st.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(st):
        step(0)
    torch.cuda.current_stream().wait_stream(st)
    with torch.cuda.graph(g):
        step(0)
    sustained(f"layer {name} graph", lambda i: g.replay())
    del g, stage, xs, gs
    torch.cuda.empty_cache()
json.dump(rows, open(out, "w"), indent=1)
