"""The profile: measured kernel and collective times that the cost model reads (JSON, versioned).

`plan profile` (runtime/profiler) writes it; `Profile.load` validates it. The cost model asks it four
kinds of question, each answered from measured points:

- `gemm_s(m, n, k)`: a bf16 GEMM [m,k] x [k,n] with a bf16 output (forward and input-gradient GEMMs);
  achieved FLOP rate interpolated in log-shape space from measured shapes (along a measured line of the
  grid whose bracketing points are at most two octaves apart, else a plane fitted to the nearest points),
  capped by the roofline.
- `wgrad_s(m, n, k)`: the weight-gradient GEMM dY^T X as the runtime runs it, accumulating into an fp32
  main gradient (reads and writes m x n fp32 besides the bf16 operands), from its own measured points:
  with few tokens (k) it is far slower than a bf16-output GEMM of the same shape, so one table for both
  mispredicted either by up to 60% (H200; benchmarks/results/README.md).
- `attention_s(...)`: flash/SDPA attention forward and backward; achieved rate interpolated over measured
  (sequence, head_dim, causal) points.
- `memory_bound_s(bytes)`: elementwise work at the measured device-copy bandwidth times an efficiency.
- `collective_s(op, bytes, group_size, link)`: latency + bytes x algorithm factor / bus bandwidth,
  fitted per op, link kind ('nvlink' inside a node, 'network' across nodes) and group size.

Each section records whether it is measured or modelled, and from what; plans copy that into their
provenance.

Modules: records (the format's dataclasses and constants), core (the Profile and its look-ups), table
(interpolation between measured GEMMs, collective fits), validate (checks of a loaded profile), files (where
profiles live, which one a plan reads, loading it), grouped (the MoE experts' grouped GEMMs), physics (collectives
beyond the measured GPUs). Which collectives exist and what distinguishes them is planner/collectives.py's table.
"""
from planner.profile.core import Profile
from planner.profile.files import (check_output_file, default_profile_path, gpu_kind_of_device, load_profile,
                                   profile_argument, resolve_profile_path, shipped_profile_path)
from planner.profile.records import (ATTENTION_POINT_KEYS, COLLECTIVE_OPS, EFFICIENCY_TERMS, FP8_GEMM_SPEEDUP,
                                     FP8_MODEL_NOTE, PROBE_EXPERTS, PROFILE_FORMAT, PROFILE_VERSION, CollectiveFit,
                                     HostOverheads, bus_factor)
from planner.profile.table import LINE_MAX_BRACKET_OCTAVES, _gemm_s_cached, _GemmTable, fit_collective

__all__ = ["ATTENTION_POINT_KEYS", "COLLECTIVE_OPS", "EFFICIENCY_TERMS", "FP8_GEMM_SPEEDUP", "FP8_MODEL_NOTE",
           "LINE_MAX_BRACKET_OCTAVES", "PROBE_EXPERTS", "PROFILE_FORMAT", "PROFILE_VERSION", "CollectiveFit",
           "HostOverheads", "Profile", "bus_factor", "check_output_file", "default_profile_path", "fit_collective",
           "gpu_kind_of_device", "load_profile", "profile_argument", "resolve_profile_path", "shipped_profile_path",
           "_GemmTable", "_gemm_s_cached"]
