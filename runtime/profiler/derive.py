"""Derive an h100-sxm (or h100-96gb) profile from a measured h200-sxm one, every derived figure labelled derived.

H100 SXM5 and H200 SXM share the GH100 die: 132 SMs, the same clocks and the same 989 TFLOP/s dense bf16, and
the same NVLink 4 (NV18, 900 GB/s bidirectional). They differ in HBM: 3.35 TB/s (80 GB HBM3) against 4.8 TB/s
(141 GB HBM3e), ratio 3.35 / 4.8 (NVIDIA datasheets). So:
- compute-bound GEMM and attention times are kept; a GEMM's time is stretched by the share of it that its
  HBM traffic alone would take (phi = operand + output bytes / copy bandwidth / time; t' = t (1 + phi (r - 1)),
  r = 4.8 / 3.35), so memory-bound small shapes scale with HBM and large ones stay;
- copy bandwidth scales by 3.35 / 4.8, the optimizer step (memory bound) by 4.8 / 3.35; elementwise efficiency
  (a fraction of the copy bandwidth) is kept;
- collectives and overlap are kept (same NVLink, same NCCL).
The H100 SXM with 96 GB HBM2e (torchtitan's benchmark GPU, its docs/performance.md: "96GB HBM2e
with 2.4 TB/sec") is the same die and NVLink with 2.4 TB/s HBM, derived the same way (profiles/build_h100_96gb_profile.py).

    python -m runtime.profiler.derive profiles/h200-sxm.json --out profiles/h100-sxm.json
"""
from __future__ import annotations

import argparse
import copy
import datetime as _dt
import sys
from pathlib import Path

from planner.errors import PlanError
from planner.profile import Profile

HBM_TB_PER_S = {"h200-sxm": 4.8, "h100-sxm": 3.35, "h100-96gb": 2.4}
SOURCE = ("NVIDIA H100 SXM5 / H200 SXM datasheets: same GH100 SMs and clocks (989 dense bf16 TFLOP/s), same NVLink 4 "
          "NV18; HBM 3.35 vs 4.8 TB/s")
SOURCES = {"h100-96gb": SOURCE + "; H100 SXM 96 GB HBM2e at 2.4 TB/s: torchtitan docs/performance.md"}
"""The datasheet line each target's derived parts cite (SOURCE unless named here)."""


def derive(src: Profile, target: str = "h100-sxm") -> Profile:
    if src.gpu not in HBM_TB_PER_S or target not in HBM_TB_PER_S:
        raise PlanError(f"can derive only between {', '.join(HBM_TB_PER_S)}; the profile is for '{src.gpu}'")
    r = HBM_TB_PER_S[src.gpu] / HBM_TB_PER_S[target]   # > 1 when the target's HBM is slower
    source = SOURCES.get(target, SOURCE)
    copy_bw = src.copy_bandwidth_bytes_per_s / r
    def scaled(m, n, k, t, out_bytes):
        # phi: the share of the time the GEMM's HBM traffic (bf16 operands, its output) takes at copy bandwidth
        phi = min(1.0, (2.0 * (m * k + k * n) + out_bytes * m * n) / src.copy_bandwidth_bytes_per_s / t)
        return (m, n, k, t * (1.0 + phi * (r - 1.0)))

    gemm = [scaled(m, n, k, t, 2.0) for m, n, k, t in src.gemm_points]
    wgrad = [scaled(m, n, k, t, 8.0) for m, n, k, t in src.wgrad_points]  # fp32 main gradient read and written
    fp8 = [scaled(m, n, k, t, 2.0) for m, n, k, t in src.fp8_points]   # bf16 operands read by the scaling passes
    prov = {
        "derived_from": copy.deepcopy(src.provenance),
        "derived_from_gpu": src.gpu,
        "derived_from_file": src.source_path,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "tool": "runtime.profiler.derive",
        "gpu_name": f"{target} (derived, not measured)",
        "parts": [
            {"part": "gemm", "status": "derived",
             "how": f"{src.gpu} times x (1 + phi ({r:.3f} - 1)), phi = HBM-traffic share of the time", "source": source},
            {"part": "attention", "status": "derived", "how": f"{src.gpu} rates kept (compute bound)", "source": source},
            {"part": "copy_bandwidth", "status": "derived", "how": f"{src.gpu} x {1 / r:.3f}", "source": source},
            {"part": "elementwise_efficiency", "status": "derived", "how": f"{src.gpu} fraction kept", "source": source},
            {"part": "optimizer_s_per_param", "status": "derived", "how": f"{src.gpu} x {r:.3f}", "source": source},
            {"part": "collectives", "status": "derived",
             "how": f"{src.gpu} fits kept (same NVLink 4 NV18); measured flags cleared", "source": source},
            {"part": "overlap_hidden_fraction", "status": "derived", "how": f"{src.gpu} values kept"},
        ],
    }
    colls = [copy.copy(c) for c in src.collectives]
    from dataclasses import replace
    colls = [replace(c, measured=False) for c in colls]
    extras = {"derived": True, "hbm_ratio": r, "source_extras_keys": sorted(src.extras)}
    out = Profile(gpu=target, provenance=prov, gemm_points=gemm, wgrad_points=wgrad, fp8_points=fp8,
                  attention_points=copy.deepcopy(src.attention_points), copy_bandwidth_bytes_per_s=copy_bw,
                  elementwise_efficiency=src.elementwise_efficiency,
                  optimizer_s_per_param=src.optimizer_s_per_param * r, collectives=colls,
                  overlap_hidden_fraction=dict(src.overlap_hidden_fraction), kernel_launch_s=src.kernel_launch_s,
                  extras=extras)
    if not src.grouped_points:
        return out
    from runtime.profiler.grouped import copied_from
    return copied_from(out, src)  # the MoE experts' grouped-over-dense ratios, labelled derived


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m runtime.profiler.derive", description=__doc__.split("\n")[0])
    p.add_argument("source", help="measured profile (h200-sxm)")
    p.add_argument("--out", "-o", required=True)
    p.add_argument("--target", default="h100-sxm", help=f"one of {', '.join(HBM_TB_PER_S)}")
    p.add_argument("--force", action="store_true")
    a = p.parse_args(argv)
    try:
        out = Path(a.out)
        if out.exists() and not a.force:
            raise PlanError(f"'{out}' exists; pass --force to overwrite it")
        prof = derive(Profile.load(Path(a.source)), a.target)
        out.parent.mkdir(parents=True, exist_ok=True)
        prof.save(out)
        Profile.load(out)
    except PlanError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    print(f"wrote {out}: {a.target} derived from {a.source}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
