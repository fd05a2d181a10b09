"""Replace one measured part of a profile with the same part of another profile, with provenance.

Used when two full profiles were measured on different lent machines and one part of one of them is known
to be worse, by measurement: session 6's call k5 measured the most complete GEMM and FP8 tables, but its host
figures predicted 68 plan-validate runs on two machines (calls k1 and k5) at 11.8% median against 7.3-7.4%
with call k1's host figures (benchmarks/results/README.md, "Session 6"). The host part moves 20-30% between
runs of the same probe (its noise, not only the machine's CPU), so the better-predicting one is kept.

    python benchmarks/compose_profile.py BASE.json --host-from OTHER.json --why "..." --out NEW.json
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def compose(base: dict, other: dict, why: str) -> dict:
    """base with other's host figures; base's provenance says where they came from and why."""
    out = json.loads(json.dumps(base))
    out["host"] = other["host"]
    src = other["provenance"]
    parts = [p for p in out["provenance"]["parts"] if p["part"] != "host_overhead"]
    host_part = next(p for p in src["parts"] if p["part"] == "host_overhead")
    parts.append({**host_part, "from_another_profile": {
        "date": src.get("date"), "git_commit": src.get("git_commit"), "gpu_name": src.get("gpu_name"),
        "host_cpu_note": "a different lent machine of the same kind than the rest of this profile",
        "why": why}})
    out["provenance"]["parts"] = parts
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base", type=Path)
    ap.add_argument("--host-from", type=Path, required=True)
    ap.add_argument("--why", required=True)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    if a.out.exists():
        raise SystemExit(f"{a.out} exists; remove it first (nothing is overwritten silently)")
    new = compose(json.loads(a.base.read_text()), json.loads(a.host_from.read_text()), a.why)
    a.out.write_text(json.dumps(new, indent=1) + "\n")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
