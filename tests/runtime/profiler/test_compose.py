"""benchmarks/compose_profile.py: parts move whole, with their provenance, and the result loads."""
import json
import sys
from pathlib import Path

import pytest

from planner.profile import Profile

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))
import compose_profile  # noqa: E402


def _variant(d: dict, factor: float, date: str) -> dict:
    v = json.loads(json.dumps(d))
    v["provenance"]["date"] = date
    v["host"]["layer_s"] = {k: x * factor for k, x in v["host"]["layer_s"].items()}
    v["collectives"] = [{**c, "latency_s": c["latency_s"] * factor} for c in v["collectives"]]
    return v


def test_host_and_collectives_move_with_their_provenance(tmp_path):
    base = json.loads((ROOT / "profiles" / "h200-sxm.json").read_text())
    a, b = _variant(base, 2.0, "A-date"), _variant(base, 3.0, "B-date")
    out = compose_profile.compose(base, {"host": a, "collectives": b}, "because")
    assert out["host"] == a["host"] and out["collectives"] == b["collectives"]
    assert out["gemm"] == base["gemm"]
    parts = {p["part"]: p for p in out["provenance"]["parts"]}
    base_host = next(p for p in base["provenance"]["parts"] if p["part"] == "host_overhead")
    if "from_another_profile" in base_host:   # an already moved part keeps its own origin
        assert parts["host_overhead"] == base_host
    else:
        assert parts["host_overhead"]["from_another_profile"]["date"] == "A-date"
    coll = [p for name, p in parts.items() if name.startswith("collectives")]
    assert coll and all("from_another_profile" in p for p in coll)
    assert all(p["from_another_profile"]["date"] == "B-date" for p in coll
               if p["from_another_profile"]["why"] == "because")
    path = tmp_path / "p.json"
    path.write_text(json.dumps(out))
    Profile.load(path)


def test_an_existing_output_is_not_overwritten(tmp_path):
    out = tmp_path / "p.json"
    out.write_text("keep")
    src = str(ROOT / "profiles" / "h200-sxm.json")
    with pytest.raises(SystemExit):
        compose_profile.main([src, "--host-from", src, "--why", "x", "--out", str(out)])
    assert out.read_text() == "keep"


def test_calibration_moves_onto_new_tables(tmp_path):
    measured = json.loads((ROOT / "profiles" / "h200-sxm.json").read_text())
    calibrated = json.loads((ROOT / "profiles" / "h200-sxm-calibrated.json").read_text())
    out = compose_profile.compose(measured, {"calibration": calibrated}, "new tables")
    assert out["efficiency"] == calibrated["efficiency"]
    assert out["overlap_hidden_fraction"] == calibrated["overlap_hidden_fraction"]
    assert out["provenance"]["calibrations"] == calibrated["provenance"]["calibrations"]
    assert out["gemm"] == measured["gemm"] and out["attention"] == measured["attention"]
    names = [p["part"] for p in out["provenance"]["parts"]]
    assert names.count("overlap_hidden_fraction") == 1   # the measured profile's modelled one is replaced
    assert any(n.startswith("efficiency") for n in names)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(out))
    assert Profile.load(path).eff("compute") == pytest.approx(calibrated["efficiency"]["compute"])
