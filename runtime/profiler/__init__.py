"""The runtime profiler: times this runtime's kernels and collectives and writes a planner Profile.

- `timing`: one timer (CUDA events after warm-up, perf_counter on CPU), median of repeats, spread kept
- `shapes`: the GEMM / attention grids derived from the model catalogue's real shapes
- `kernels`: GEMMs, attention, memory-bound kernels, optimizer step, launch overhead
- `collectives`: spawned processes (NCCL on GPU, gloo on CPU) timing collectives, fitted per op and group
- `modelled`: stated models for what was not measured (larger NVSwitch groups, network links, overlap)
- `environment`: provenance (GPU, driver, CUDA, torch, NCCL, topology, git commit)
- `build`: assembles the Profile; `cli`: `plan profile`; `derive`: h100-sxm from an h200-sxm profile
"""
