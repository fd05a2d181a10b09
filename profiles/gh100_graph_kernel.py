"""The fixed GPU time per kernel of a step replayed as a CUDA graph (Profile.graph_kernel_s) for profiles derived from
the H100 SXM: the GH100 die starts and drains a graphed kernel the same way whatever its HBM or NVLink, so the value
fitted on measured H100 runs (profiles/h100-sxm-calibrated.json, benchmarks/fit_graph_kernel.py) is carried over.
Without it a derived profile prices each kernel of a graphed step at the eager launch's host time."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from planner.errors import PlanError
from planner.profile import Profile

FITTED_ON = Path(__file__).resolve().parent / "h100-sxm-calibrated.json"


def with_gh100_graph_kernel(prof: Profile, fitted_on: Path = FITTED_ON) -> Profile:
    """`prof` with the graph_kernel_s of `fitted_on` (an h100-sxm profile that has one), recorded as a part of its
    provenance."""
    src = Profile.load(fitted_on)
    if src.gpu != "h100-sxm" or src.graph_kernel_s is None:
        raise PlanError(f"'{fitted_on}' is not an h100-sxm profile with a fitted graph_kernel_s")
    prov = dict(prof.provenance)
    prov["parts"] = list(prov.get("parts", [])) + [{
        "part": "graph_kernel_s", "status": "derived",
        "how": f"{src.graph_kernel_s * 1e6:.2f} us, fitted on the H100 (the same GH100 die): profiles/{fitted_on.name} "
               "(benchmarks/fit_graph_kernel.py on the H100 validation runs, benchmarks/results/calibration/)"}]
    return replace(prof, graph_kernel_s=src.graph_kernel_s, provenance=prov)
