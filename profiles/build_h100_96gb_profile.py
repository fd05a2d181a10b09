"""Derive the H100 SXM 96 GB HBM2e profile (`h100-96gb.json`) from the measured H100 SXM one (80 GB HBM3, 3.35 TB/s),
every figure labelled modelled (derived). torchtitan's benchmark GPU (docs/performance.md at its benchmarked commit 9dec370: "96GB HBM2e
with 2.4 TB/sec", "the default 500W power limit"): the H100 SXM die, clocks and NVLink 4 with slower HBM.

- Kernels: runtime/profiler/derive.py's HBM scaling from h100-sxm (3.35 TB/s) to 2.4 TB/s: a GEMM's time stretched by
  the share of it its HBM traffic takes, copy bandwidth and the optimizer step by the HBM ratio, attention kept (the
  same die at the same clocks).
- Collectives: the h100-sxm profile's 2-GPU NVLink points kept (same NVLink 4), every other group and the network from
  the physics model (planner/profile/physics.py, H100 SXM's fractions: same NVLink 4 and NVSwitch).
- Grouped GEMMs: the h100-sxm profile's grouped-over-dense ratios copied (runtime/profiler/derive.py, through
  runtime.profiler.grouped.copied_from), applied to this profile's own dense GEMMs.
- A graphed step's per-kernel time: the one fitted on the H100 (gh100_graph_kernel.py).
- Not modelled: the 500 W power limit (the H100 SXM's default is 700 W). No measured clock-against-power data
  exists here, so compute-bound kernels keep the measured H100's (700 W) rates and this profile is faster than a
  500 W card.

    python profiles/build_h100_96gb_profile.py [--force]
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from planner.errors import PlanError
from planner.profile import Profile

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from build_modelled_collectives import remodel, write_new_profile  # noqa: E402
from gh100_graph_kernel import with_gh100_graph_kernel  # noqa: E402

GPU = "h100-96gb"
POWER_NOTE = ("torchtitan ran these H100s at 'the default 500W power limit' (docs/performance.md, commit 9dec370); "
              "the power cap is not modelled: no measured clock-against-power data, so compute-bound kernels keep "
              "the measured H100's rates at 700 W, and this profile is faster than such a card where it is compute bound")


def derive(src: Profile) -> Profile:
    """The kernels, collectives and grouped GEMMs of the profile (runtime/profiler/derive.py carries the last)."""
    from runtime.profiler.derive import derive as derive_hbm

    if src.gpu != "h100-sxm":
        raise PlanError(f"the H100 96 GB profile is derived from a measured h100-sxm profile; this one is for '{src.gpu}'")
    prof = derive_hbm(src, GPU)
    prov = dict(prof.provenance)
    prov.update(kind="modelled (derived)", tool="profiles/build_h100_96gb_profile.py (runtime.profiler.derive)",
                gpu_name=f"{GPU} (modelled: H100 SXM 96 GB HBM2e, 2.4 TB/s; not measured)")
    prov["parts"] = list(prov["parts"]) + [{"part": "power_limit", "status": "not modelled", "how": POWER_NOTE}]
    from dataclasses import replace
    return with_gh100_graph_kernel(remodel(replace(prof, provenance=prov)))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    measured = Path(os.path.relpath(HERE / "h100-sxm.json"))   # recorded as given: profiles/h100-sxm.json from the root
    return write_new_profile(lambda: derive(Profile.load(measured)), HERE / f"{GPU}.json", "--force" in argv)


if __name__ == "__main__":
    sys.exit(main())
