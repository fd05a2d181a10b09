"""Derive the H800 SXM profile (`h800.json`) from the H100 one: the same die, clocks and HBM, so every kernel figure
is kept; NVLink is cut to 400 GB/s bidirectional (200 per direction), so every NVLink collective comes from the
physics model (planner/profile/physics.py, H100's achieved fractions over 200 GB/s), none from the 2-GPU H200 points;
a graphed step's per-kernel time is the one fitted on the H100 (gh100_graph_kernel.py).

    python profiles/build_h800_profile.py [--force]
"""
from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

from planner.errors import PlanError
from planner.profile import Profile

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from build_modelled_collectives import remodel, write_new_profile  # noqa: E402
from gh100_graph_kernel import with_gh100_graph_kernel  # noqa: E402


def derive(src: Profile) -> Profile:
    if src.gpu != "h100-sxm":
        raise PlanError(f"the H800 profile is derived from the h100-sxm profile; this one is for '{src.gpu}'")
    prov = {"kind": "modelled (derived)", "tool": "profiles/build_h800_profile.py", "gpu_name": "h800 (modelled)",
            "derived_from_file": src.source_path, "derived_from": src.provenance,
            "parts": [{"part": "kernels", "status": "modelled", "how": "h100-sxm figures kept (same GH100 die, HBM3)"},
                      {"part": "collectives/nvlink", "status": "modelled",
                       "how": "physics model over 200 GB/s per direction at every group size"}]}
    out = with_gh100_graph_kernel(remodel(replace(src, gpu="h800", provenance=prov, collectives=[])))
    if not src.grouped_points:
        return out
    from runtime.profiler.grouped import copied_from
    return copied_from(out, src)  # h100-sxm's grouped GEMMs, with their record of where they were measured


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    return write_new_profile(lambda: derive(Profile.load(HERE / "h100-sxm.json")), HERE / "h800.json",
                             "--force" in argv)


if __name__ == "__main__":
    sys.exit(main())
