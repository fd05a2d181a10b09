"""The simulation's report: a table per rank, or one JSON object (`ranks`: one entry per rank simulated)."""
from __future__ import annotations


GIB = 2**30
PART_NAMES = ("weights", "gradients", "optimizer", "other_state", "activations", "temporaries")


def rank_json(r) -> dict:
    """One rank's entry: memory parts in GiB (traced and predicted), collectives per kind and group per step."""
    return {
        "rank": r.rank, "stage": r.stage, "coordinates": r.coordinates,
        "predicted_tensor_gib": r.predicted_tensor_gib, "traced_tensor_gib": r.traced_tensor_gib,
        "predicted_total_gib": r.predicted_total_gib,
        "predicted_parts_gib": {k: r.predicted.get(k, 0.0) / GIB for k in PART_NAMES},
        "traced_parts_gib": {k: r.traced.get(k, 0.0) / GIB for k in PART_NAMES},
        "collectives": [{"kind": c.kind, "group": c.group, "group_size": c.group_size, "count": c.count,
                         "predicted_bytes": c.predicted_bytes, "traced_bytes": c.traced_bytes}
                        for c in r.collectives],
        "seconds": r.seconds, "build_seconds": r.build_seconds, "cpu_seconds": r.cpu_seconds,
    }


def _err(traced: float, predicted: float | None) -> str:
    if not predicted:
        return "-"
    return f"{100 * (traced - predicted) / predicted:+.1f}%"


def table(plan_name: str, entries: list[dict]) -> str:
    """The per-rank tables of rank_json entries."""
    lines = [f"simulated {plan_name}: {len(entries)} rank(s), fake process group and fake tensors"]
    for e in entries:
        lines.append(f"\nrank {e['rank']} (pipeline rank {e['stage']}), {e['seconds']:.1f} s ({e.get('cpu_seconds', 0):.1f} s CPU)")
        lines.append(f"  {'memory (GiB)':<16}{'predicted':>11}{'traced':>11}{'error':>9}")
        for k in PART_NAMES:
            p, t = e["predicted_parts_gib"][k], e["traced_parts_gib"][k]
            lines.append(f"  {k:<16}{p:>11.4g}{t:>11.4g}{_err(t, p):>9}")
        lines.append(f"  {'tensors':<16}{e['predicted_tensor_gib']:>11.4g}{e['traced_tensor_gib']:>11.4g}"
                     f"{_err(e['traced_tensor_gib'], e['predicted_tensor_gib']):>9}")
        lines.append(f"  (the planner's figure with cuBLAS workspaces: {e['predicted_total_gib']:.4g} GiB; its allowance "
                     "for memory outside the allocator and fragmentation comes on top)")
        lines.append(f"  {'collectives/step':<24}{'count':>7}{'predicted MB':>14}{'traced MB':>12}{'error':>9}")
        for c in e["collectives"]:
            p = c["predicted_bytes"]
            ptxt = f"{p / 1e6:.4g}" if p is not None else "-"
            lines.append(f"  {c['kind'] + ' ' + c['group']:<24}{c['count']:>7}{ptxt:>14}"
                         f"{c['traced_bytes'] / 1e6:>12.4g}{_err(c['traced_bytes'], p):>9}")
    return "\n".join(lines)
