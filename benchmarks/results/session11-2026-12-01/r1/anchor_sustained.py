"""Session 10: the torch.compile anchor (../shared/anchors/gpt_step_anchor.py, imported unchanged) timed over
40 steps instead of 10, each step between CUDA events, so that its figure can be read under the same sustained
load as ours. Call p2 logged the GPU's clocks: the anchor's own 10-step timing (1.2 s) ends before the 700 W
power cap engages (clock 1860-1965 MHz, power still ramping), while our 40-step runs sit at the cap
(1425-1830 MHz). Prints one JSON line with both protocols."""
import json
import statistics
import sys
import time

import torch

sys.path.insert(0, "anchors")
import gpt_step_anchor as A  # noqa: E402

STEPS = 40


def sustained(step, iters=10, warm=3):
    for _ in range(warm):
        step()
    torch.cuda.synchronize()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(STEPS + 1)]
    t0 = time.perf_counter()
    ev[0].record()
    for i in range(STEPS):
        step()
        ev[i + 1].record()
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    per = [ev[i].elapsed_time(ev[i + 1]) / 1e3 for i in range(STEPS)]
    first10 = sum(per[:iters]) / iters   # the anchor's own protocol: mean of the first 10 after warm-up
    print(json.dumps({"anchor_sustained": "torch.compile", "steps": STEPS, "first10_mean_s": round(first10, 5),
                      "median_steps_5_16_s": round(statistics.median(per[4:16]), 5),
                      "median_steps_16_40_s": round(statistics.median(per[15:]), 5),
                      "median_all_s": round(statistics.median(per), 5), "wall_s": round(wall, 3),
                      "per_step_s": [round(x, 5) for x in per]}), flush=True)
    return first10


A.timed = sustained
A.run_torch(24, 2048, 16, 2048, 4, compile_=True)
