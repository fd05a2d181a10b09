"""Derive the A100 SXM 80 GB profile (`a100-80gb.json`) from the measured H200 one by published ratios, every
figure labelled modelled with how and the rows of benchmarks/published/a100.csv it rests on (rows counted from 1).

- GEMMs: a GEMM's time splits into its compute-bound and HBM-bound shares (phi = operand + output bytes at the
  H200's copy bandwidth over its time, as runtime/profiler/derive.py does for H100); the compute share scales by
  the best measured bf16 matmul rates, A100 271.2 against H100/H200 794.5 TFLOP/s (rows 8 and 37, the same
  benchmark, mamf-finder), the HBM share by the copy-bandwidth ratio below. No FP8 on A100: no FP8 table
  (a plan asking for FP8 on A100 gets the modelled FP8 of planner/profile, which A100 hardware cannot run).
- Attention: rates x 230 / (this profile's best forward rate), i.e. the H200 curve carried to FlashAttention-2's
  best A100 forward rate (row 20: 230 TFLOP/s, 73% of 312). The ratio comes out within 1% of the GEMM ratio.
- Memory-bound kernels (copy bandwidth, the named elementwise and embedding/loss kernels, the AdamW step): x the
  ratio of the same STREAM-like copy benchmark, A100 1.61 against H200 4.01 TB/s (rows 16 and 50).
- Collectives: NVLink 3, 300 GB/s per direction (row 5), through the physics model (planner/profile/physics.py:
  ring at 0.78 of it, collectives.csv rows 1-13); network entries as for every profile.
- Host time per layer and kernel launch: kept (CPU side).

    python profiles/build_a100_profile.py [--source profiles/h200-sxm.json] [--out profiles/a100-80gb.json] [--force]
"""
from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

from planner.errors import PlanError
from planner.profile import Profile, physics

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from build_modelled_collectives import remodel, write_new_profile  # noqa: E402

A100_CSV = "benchmarks/published/a100.csv"
GEMM_A100_TFLOPS, GEMM_H100_TFLOPS = 271.2, 794.5          # a100.csv rows 8, 37
FA2_A100_FWD_TFLOPS = 230.0                                  # row 20
COPY_A100_TB_S, COPY_H200_TB_S = 1.61, 4.01                  # rows 16, 50
NVLINK_A100_GB_S = 300.0                                     # row 5
ROWS = {"gemm": (8, 37), "attention": (20, 21), "memory": (16, 50), "nvlink": (5,)}


def derive(src: Profile) -> Profile:
    if src.gpu != "h200-sxm":
        raise PlanError(f"the A100 profile is derived from a measured h200-sxm profile; this one is for '{src.gpu}'")
    rc = GEMM_H100_TFLOPS / GEMM_A100_TFLOPS      # > 1: A100 compute is slower
    rm = COPY_H200_TB_S / COPY_A100_TB_S          # > 1: A100 HBM is slower
    copy_bw = src.copy_bandwidth_bytes_per_s

    def scaled(m, n, k, t, out_bytes):
        phi = min(1.0, (2.0 * (m * k + k * n) + out_bytes * m * n) / copy_bw / t)
        return (m, n, k, t * ((1.0 - phi) * rc + phi * rm))

    best_fwd = max(p["fwd_tflops"] for p in src.attention_points)
    ra = FA2_A100_FWD_TFLOPS / best_fwd
    attn = [{**p, "fwd_tflops": p["fwd_tflops"] * ra, "bwd_tflops": p["bwd_tflops"] * ra,
             **{k: p[k] / ra for k in ("fwd_s", "bwd_s") if k in p}} for p in src.attention_points]
    extras = {"derived": True, "derived_ratios": {"gemm_compute": rc, "memory": rm, "attention": 1 / ra}}
    for section in ("elementwise", "embedding_and_loss"):
        sec = copy.deepcopy(src.extras.get(section) or {})
        kernels = sec.get("kernels", sec)
        for v in kernels.values():
            if isinstance(v, dict) and "seconds" in v:
                v["seconds"] *= rm
        extras[section] = sec
    src_rows = lambda part: f"{A100_CSV} rows {', '.join(map(str, ROWS[part]))}"  # noqa: E731
    parts = [
        {"part": "gemm", "status": "modelled",
         "how": f"h200-sxm times x ((1 - phi) {rc:.3f} + phi {rm:.3f}), phi = HBM-traffic share of the time; "
                f"{rc:.3f} = best bf16 matmul H100 {GEMM_H100_TFLOPS} / A100 {GEMM_A100_TFLOPS} TFLOP/s",
         "source": src_rows("gemm")},
        {"part": "fp8", "status": "modelled", "how": "no FP8 table: A100 has no FP8 tensor cores"},
        {"part": "attention", "status": "modelled",
         "how": f"h200-sxm rates x {ra:.4f} = FlashAttention-2's best A100 forward {FA2_A100_FWD_TFLOPS} TFLOP/s over "
                f"this profile's best forward {best_fwd:.1f}", "source": src_rows("attention")},
        {"part": "copy_bandwidth", "status": "modelled",
         "how": f"h200-sxm x {1 / rm:.4f} (copy benchmark A100 {COPY_A100_TB_S} / H200 {COPY_H200_TB_S} TB/s)",
         "source": src_rows("memory")},
        {"part": "elementwise_efficiency", "status": "modelled", "how": "h200-sxm fraction of copy bandwidth kept; "
                                                                          "named kernels' seconds x the memory ratio"},
        {"part": "optimizer_s_per_param", "status": "modelled", "how": f"h200-sxm x {rm:.4f} (memory bound)",
         "source": src_rows("memory")},
        {"part": "host_overhead", "status": "modelled", "how": "h200-sxm host figures kept (CPU side)"},
        {"part": "overlap_hidden_fraction", "status": "modelled", "how": "h200-sxm values kept"},
    ]
    prov = {"kind": "modelled (derived by published ratios)", "tool": "profiles/build_a100_profile.py",
            "gpu_name": "a100-80gb (modelled, not measured)", "derived_from_file": src.source_path,
            "derived_from": {k: src.provenance.get(k) for k in ("date", "git_commit", "gpu_name", "torch", "nccl",
                                                                "environment_forced")},
            "parts": parts}
    out = Profile(gpu="a100-80gb", provenance=prov,
                  gemm_points=[scaled(m, n, k, t, 2.0) for m, n, k, t in src.gemm_points],
                  wgrad_points=[scaled(m, n, k, t, 8.0) for m, n, k, t in src.wgrad_points],
                  attention_points=attn, copy_bandwidth_bytes_per_s=copy_bw / rm,
                  elementwise_efficiency=src.elementwise_efficiency,
                  optimizer_s_per_param=src.optimizer_s_per_param * rm, collectives=[],
                  overlap_hidden_fraction=dict(src.overlap_hidden_fraction), kernel_launch_s=src.kernel_launch_s,
                  extras=extras, host=src.host)
    assert physics.NODES["a100-80gb"].nvlink_gb_per_s == NVLINK_A100_GB_S
    from runtime.profiler.grouped import copied_from
    return copied_from(remodel(out), src) if src.grouped_points else remodel(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python profiles/build_a100_profile.py", description=__doc__.split("\n")[0])
    p.add_argument("--source", default=str(HERE / "h200-sxm.json"))
    p.add_argument("--out", default=str(HERE / "a100-80gb.json"))
    p.add_argument("--force", action="store_true")
    a = p.parse_args(argv)
    return write_new_profile(lambda: derive(Profile.load(Path(a.source))), Path(a.out), a.force,
                             f"a100-80gb derived from {a.source} by published ratios")


if __name__ == "__main__":
    sys.exit(main())
