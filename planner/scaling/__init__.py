"""`plan scaling`: the best plan at each GPU count, as a strong or weak scaling report.

For every GPU count of `--gpus` the search (planner.search) picks the best layout; the report gives its
predicted step time, tokens/s, TFLOP/s per GPU, MFU, scaling efficiency against the first point that has
a plan, memory headroom and time breakdown. Strong scaling keeps the global batch fixed; weak scaling
keeps the batch per GPU fixed (the global batch grows with the GPUs).

Writes DIR/scaling.csv (one row per series and GPU count, rows where nothing fits carry the reason),
DIR/throughput.png, DIR/efficiency.png, DIR/breakdown.png, DIR/memory.png and DIR/report.md.

What-if series: `--compare-gpu KIND` (another GPU kind; its shipped profile, `--compare-profile`, or the
baseline profile rescaled by datasheet ratios, which the report marks as modelled) and
`--compare-inter-node-gbps X` (another network bandwidth per GPU). `--tokens T` adds the time and the
GPU-hours to train T tokens. `--validate-csv FILE` overlays measured points from `plan validate`.

Modules: command (arguments, main, the printed summary), points (series, the best plan per GPU count, efficiency,
measured points), output (plots and report.md).
"""
from planner.scaling.command import main

__all__ = ["main"]
