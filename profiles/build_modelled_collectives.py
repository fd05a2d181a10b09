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
from pathlib import Path

from planner.errors import PlanError
from planner.profile import Profile
from planner.profile.physics import remodel_collectives as remodel

def write_new_profile(make, out: Path, force: bool, done: str = "") -> int:
    """The derivation scripts' shared end: refuse an existing `out` without --force, save make()'s profile, read it
    back; one sentence on stderr and 1 on a PlanError, else 0 and `wrote OUT[: done]`."""
    try:
        if out.exists() and not force:
            raise PlanError(f"'{out}' exists; pass --force to overwrite it")
        make().save(out)
        Profile.load(out)
    except PlanError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {out}" + (f": {done}" if done else ""))
    return 0


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
