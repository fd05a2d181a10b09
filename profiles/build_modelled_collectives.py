"""Rewrite a profile's modelled collective entries from the physics model (planner/profile/physics.py): the NVLink
groups it has no points for (4 and 8 GPUs where 2 were measured) and the network entries. Entries with points
(measured, or carried from a measured profile) stay as they are. The profile's other sections are untouched.

    python profiles/build_modelled_collectives.py profiles/h200-sxm.json profiles/h200-sxm-calibrated.json \\
        profiles/h100-sxm.json

Rewrites each file in place (they are the files this script is for); --out writes one profile elsewhere instead.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from planner.errors import PlanError
from planner.profile import Profile
from planner.profile import physics

REPLACED_PARTS = ("collectives/nvlink groups", "collectives/network")


def remodel(prof: Profile) -> Profile:
    if prof.gpu not in physics.NODES:
        raise PlanError(f"the physics model has no figures for GPU '{prof.gpu}'; known: {', '.join(physics.NODES)}")
    forced = (prof.provenance.get("environment_forced") or prof.provenance.get("derived_from", {})
              .get("environment_forced") or {})
    nvls = forced.get("NCCL_NVLS_ENABLE", "1") != "0" and prof.gpu != "a100-80gb"
    kept = [c for c in prof.collectives if c.points]
    colls = kept + physics.modelled_entries(prof.gpu, kept, nvls=nvls)
    prov = dict(prof.provenance)
    prov["parts"] = [p for p in prov.get("parts", []) if not str(p.get("part", "")).startswith(REPLACED_PARTS)] \
        + physics.provenance(prof.gpu, nvls)
    extras = dict(prof.extras)
    extras["network_model"] = {"nic_gb_per_s": physics.NOMINAL_NIC_GB_PER_S,
                               "latency_us_per_step": physics.NET_STEP_S * 1e6, "model": "planner/profile/physics.py"}
    return replace(prof, collectives=colls, provenance=prov, extras=extras)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python profiles/build_modelled_collectives.py", description=__doc__.split("\n")[0])
    p.add_argument("profiles", nargs="+")
    p.add_argument("--out", help="write the (single) result here instead of in place")
    a = p.parse_args(argv)
    try:
        if a.out and len(a.profiles) != 1:
            raise PlanError("--out takes one profile")
        for path in a.profiles:
            prof = remodel(Profile.load(Path(path)))
            out = Path(a.out or path)
            prof.save(out)
            Profile.load(out)
            print(f"wrote {out}: {sum(not c.points for c in prof.collectives)} modelled collective entries")
    except PlanError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
