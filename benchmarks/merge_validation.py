"""Merge `plan validate --append` outputs (validation.csv + validation.plans.jsonl pairs) into one pair,
rows renumbered, for `plan calibrate` and benchmarks/validation_report.py.

    python benchmarks/merge_validation.py OUT_DIR RUN_DIR [RUN_DIR ...]   # writes OUT_DIR/all.csv, all.plans.jsonl
    python benchmarks/merge_validation.py OUT_DIR RUN_DIR ... --models llama-1b-gqa,bert-large   # those models' rows only
"""
from __future__ import annotations

import csv
import json
import sys
from pathlib import Path


def merge(out_dir: Path, run_dirs: list[Path], models: set[str] | None = None) -> int:
    rows, plans, header = [], [], None
    for d in run_dirs:
        with open(d / "validation.csv", newline="") as fh:
            reader = csv.DictReader(fh)
            header = header or reader.fieldnames
            if reader.fieldnames != header:
                raise SystemExit(f"error: {d / 'validation.csv'} has other columns than the first file")
            these = list(reader)
        with open(d / "validation.plans.jsonl") as fh:
            by_row = {rec["row"]: rec for rec in map(json.loads, fh)}
        for i, row in enumerate(these, start=1):
            if i not in by_row:
                raise SystemExit(f"error: {d} has no plan for row {i}")
            if models is not None and row["model"] not in models:
                continue
            rows.append(row)
            plans.append({**by_row[i], "row": len(rows)})
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in ("all.csv", "all.plans.jsonl"):
        if (out_dir / name).exists():
            raise SystemExit(f"error: {out_dir / name} exists; not overwriting it")
    with open(out_dir / "all.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=header)
        w.writeheader()
        w.writerows(rows)
    with open(out_dir / "all.plans.jsonl", "w") as fh:
        fh.writelines(json.dumps(p) + "\n" for p in plans)
    return len(rows)


if __name__ == "__main__":
    args = sys.argv[1:]
    models = None
    if "--models" in args:
        i = args.index("--models")
        if i + 1 >= len(args):
            raise SystemExit("error: --models needs a comma-separated list of model names")
        models = set(args[i + 1].split(","))
        del args[i:i + 2]
    if len(args) < 2:
        raise SystemExit(__doc__)
    n = merge(Path(args[0]), [Path(p) for p in args[1:]], models)
    print(f"merged {n} rows into {args[0]}/all.csv and all.plans.jsonl")
