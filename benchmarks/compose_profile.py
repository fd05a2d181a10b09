"""Replace measured parts of a profile (host figures, collectives) with the same parts of other profiles, with
provenance.

Used when full profiles were measured on different lent machines and one part of one of them is known to be
worse, by measurement:
  * host: of the full profiles measured on 2x H200 on 2026-11-30, the most complete GEMM and FP8 tables came
    with host figures that predicted 68 plan-validate runs on two machines at 11.8% median, against 7.3-7.4%
    with the host figures of the 16:39 UTC profile (tree d4e03ce). The host part moves 20-30% between runs of
    the same probe (its noise, not only the machine's CPU), so the better-predicting one is kept; a later
    comparison on four machines' runs found the same.
  * collectives: the 19:21 UTC profile of that day (tree 95129b7) measured send/recv at 4 KiB - 16 MiB at 8 us
    in some points and 40-90 us in others (the ranks' skew, fixed in runtime/profiler/collectives.py
    afterwards); the 19:03 UTC profile's points (tree 053b23e), measured with the same spin, were monotonic and
    its accuracy run agreed within 5% for 54 of 55 points.

  * attention points: head dimensions the base has none of, timed by benchmarks/attention_head_dims.py (the
    profiler's kernels.time_attention on shapes.attention_grid's rows). 192 and 256 (Gemma's) were added to the
    shipped profiles, which had 64 and 128 (benchmarks/results/attention-head-dims/): above 128 the nearest
    measured rate was used, and the backward ran up to 54% slower than so predicted.

    python benchmarks/compose_profile.py BASE.json [--host-from A.json] [--collectives-from B.json] \
        [--elementwise-from C.json] [--calibration-from D.json] [--attention-points-from E.csv] --why "..." \
        --out NEW.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from planner.profile import ATTENTION_POINT_KEYS  # noqa: E402

PARTS = {"host": (("host",), lambda name: name == "host_overhead"),
         "collectives": (("collectives",), lambda name: name.startswith("collectives")),
         "elementwise": (("elementwise_efficiency", "extras.elementwise"), lambda name: name == "elementwise_efficiency"),
         "calibration": (("efficiency", "overlap_hidden_fraction", "provenance.calibrations"),
                         lambda name: name == "overlap_hidden_fraction" or name.startswith("efficiency"))}
"""part -> (the profile's keys it owns, dotted for nested ones, and which provenance parts describe it).
  * elementwise: the runtime's memory-bound kernels (norms, activations, rotary, residual add), timed again
    when the runtime changes them (as when the residual add was fused into the norms, runtime/norm.py) while
    the rest of the profile stays as measured.
  * calibration: the fitted efficiency factors and overlap fractions (with their records), carried onto newly
    measured kernel tables so that `plan calibrate` refits only the terms the new runs can see (kernels
    timed at the power cap, with the two-GPU terms fitted on benchmarks/results/calibration/runs.csv kept)."""


def compose(base: dict, others: dict[str, dict], why: str) -> dict:
    """base with each part taken from others[part]; the provenance of every moved part says where it came from
    and why (an already composed part keeps its own origin)."""
    out = json.loads(json.dumps(base))
    for part, other in others.items():
        keys, describes = PARTS[part]
        for k in keys:
            *path, last = k.split(".")
            dst, src_d = out, other
            for step in path:
                dst, src_d = dst.setdefault(step, {}), src_d[step]
            dst[last] = src_d[last]
        src = other["provenance"]
        kept = [p for p in out["provenance"]["parts"] if not describes(p["part"])]
        moved = [p if "from_another_profile" in p else {**p, "from_another_profile": {
            "date": src.get("date"), "git_commit": src.get("git_commit"), "gpu_name": src.get("gpu_name"),
            "hostname": src.get("hostname"), "host_cpu_model": src.get("host_cpu_model"),
            "note": "measured apart from the rest of this profile (another call, maybe another lent machine "
                    "of the same kind)", "why": why}}
            for p in src["parts"] if describes(p["part"])]
        out["provenance"]["parts"] = kept + moved
    return out


def add_attention_points(base: dict, csv_path: Path, why: str) -> dict:
    """base with the attention points of csv_path (benchmarks/attention_head_dims.py's CSV) whose head dimension
    the base has none of; the provenance names the file and why. Points of head dimensions it has are left out."""
    import csv

    out = json.loads(json.dumps(base))
    have = {p["head_dim"] for p in out["attention"]["points"]}
    rows = list(csv.DictReader(csv_path.open()))
    if not rows:
        raise SystemExit(f"{csv_path} has no rows")
    added = []
    for r in rows:
        if int(r["head_dim"]) in have:
            continue
        pt = {k: (r[k] == "True" if k == "causal" else int(r[k]) if k in ("seq", "head_dim", "batch", "heads")
                  else float(r[k])) for k in ATTENTION_POINT_KEYS}
        added.append(pt)
    if not added:
        raise SystemExit(f"{csv_path} holds no head dimension the base lacks")
    out["attention"]["points"] += added
    dims = sorted({p["head_dim"] for p in added})
    # where and when they were measured: attention_head_dims.py's provenance.json beside the CSV (calls before it
    # wrote one name their machine, date and tree in `why`)
    side = csv_path.parent / "provenance.json"
    measured = {k: v for k, v in json.loads(side.read_text()).items()
                if k in ("date", "git_commit", "gpu_name", "hostname", "driver", "cuda", "torch", "at_power_cap")} \
        if side.exists() else {}
    out["provenance"]["parts"].append({
        "part": f"attention head dimensions {', '.join(map(str, dims))}", "status": "measured",
        "how": f"{len(added)} points from {csv_path.as_posix()} (benchmarks/attention_head_dims.py: kernels.time_attention "
               "on shapes.attention_grid's rows, as the profiler times its grid), added to this profile",
        "from_another_profile": {**measured, "note": "measured apart from the rest of this profile (another call, "
                                                     "maybe another lent machine of the same kind)", "why": why}})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base", type=Path)
    ap.add_argument("--host-from", type=Path)
    ap.add_argument("--collectives-from", type=Path)
    ap.add_argument("--elementwise-from", type=Path)
    ap.add_argument("--calibration-from", type=Path)
    ap.add_argument("--attention-points-from", type=Path)
    ap.add_argument("--why", required=True)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    if a.out.exists():
        raise SystemExit(f"{a.out} exists; remove it first (nothing is overwritten silently)")
    others = {part: json.loads(path.read_text()) for part, path in (("host", a.host_from),
                                                                    ("collectives", a.collectives_from),
                                                                    ("elementwise", a.elementwise_from),
                                                                    ("calibration", a.calibration_from)) if path}
    if not others and not a.attention_points_from:
        raise SystemExit("nothing to compose: give --host-from, --collectives-from, --elementwise-from, "
                         "--calibration-from and/or --attention-points-from")
    new = compose(json.loads(a.base.read_text()), others, a.why)
    if a.attention_points_from:
        new = add_attention_points(new, a.attention_points_from, a.why)
    a.out.write_text(json.dumps(new, indent=1) + "\n")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
