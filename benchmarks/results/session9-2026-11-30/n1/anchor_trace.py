"""Session 9: kernel table of the torch.compile anchor's GPT-1.3B step (../shared/anchors/gpt_step_anchor.py,
imported unchanged; only its timing helper is wrapped to trace one step after warm-up)."""
import sys
import torch
sys.path.insert(0, "anchors")
import gpt_step_anchor as A

out = sys.argv[1]
_timed = A.timed


def traced(step, iters=10, warm=3):
    dt = _timed(step, iters, warm)
    from torch.profiler import profile, ProfilerActivity
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step(); torch.cuda.synchronize()
    with open(out, "w") as fh:
        fh.write(prof.key_averages().table(sort_by="cuda_time_total", row_limit=60, max_name_column_width=90))
        ev = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        fh.write(f"\nkernels {len(ev)}, sum {sum(e.self_device_time_total for e in ev) / 1e3:.2f} ms; timed step {dt * 1e3:.2f} ms\n")
    return dt


A.timed = traced
A.run_torch(24, 2048, 16, 2048, 4, compile_=True)
