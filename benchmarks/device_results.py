"""Where a device benchmark leaves its result: DIR/<name>.csv (one row per measured case) and DIR/provenance.json (the
machine, GPU, versions and commit as runtime.profiler.environment.describe gives them, plus what the script adds).
Shared by the one-GPU kernel benchmarks (attention_backends.py, attention_head_dims.py, fp8_grouped_gemm.py)."""
from __future__ import annotations

import csv
import json
from pathlib import Path


def write_device_results(out: Path, name: str, rows: list[dict], device, **provenance) -> None:
    """Write `rows` to out/<name>.csv and the device's provenance, updated with `provenance`, to
    out/provenance.json (out is created)."""
    from runtime.profiler import environment

    out.mkdir(parents=True, exist_ok=True)
    with open(out / f"{name}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    prov = environment.describe(device, 1)
    prov.update(provenance)
    (out / "provenance.json").write_text(json.dumps(prov, indent=1) + "\n")
