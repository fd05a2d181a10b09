"""What is alive at a step's memory peak, from the CUDA caching allocator's own history.

`torch.cuda.max_memory_allocated()` says how high a step went, not what it held there. When a run peaks above
the planner's memory prediction, this names the tensors:
`plan launch --memory-step N --memory-out PREFIX` records the allocator's history (allocations and frees with
their Python stacks, `torch.cuda.memory._record_memory_history`) during step N, replays it to the peak, and
writes PREFIX.rank<r>.json: the bytes allocated before the step (weights, gradients, optimizer states,
communication buffers), the peak, and the allocations alive at the peak grouped by where they were made.

The JSON is data, not the allocator's pickle: sizes in MiB and the few frames that say which code made the
tensor (this repository's frames first, then the op).
"""
from __future__ import annotations

import json
from pathlib import Path

MAX_ENTRIES = 2_000_000
"""Allocator events kept (a ring buffer); a step of a 24-layer model makes some tens of thousands."""

FRAMES_PER_SITE = 3


def _site(frames: list[dict]) -> str:
    """Where an allocation was made: the innermost frames of this repository (runtime/, planner/), else the
    innermost frames at all, as 'file:line name' joined by ' < '."""
    ours = [f for f in frames if "/runtime/" in f.get("filename", "") or "/planner/" in f.get("filename", "")]
    pick = (ours or frames)[:FRAMES_PER_SITE]
    return " < ".join(f"{Path(f.get('filename', '?')).name}:{f.get('line', 0)} {f.get('name', '')}" for f in pick) \
        or "(no stack)"


def peak_live(events: list[dict], baseline_bytes: int, top: int = 40) -> dict:
    """Replay allocator events (dicts with 'action', 'addr', 'size', 'frames'): the peak of baseline + live
    allocations and what was alive at it, grouped by allocation site, largest first. An allocation's memory
    returns at 'free_completed' (a 'free_requested' one may still be in use by another stream); so does the
    memory of a block allocated before the step (in the baseline) when the step frees it; a replay that ignores
    those frees overstates the peak (by 2.6 GiB above max_memory_allocated for an FSDP step).

    Args:
        events: the allocator's trace entries of the step, oldest first.
        baseline_bytes: bytes allocated when the step began.
        top: how many allocation sites to list.

    Returns:
        A dict of MiB figures (baseline, peak, baseline freed before the peak, allocated in the step at the
        peak) and `at_peak`, the `top` allocation sites alive at the peak, largest first."""
    live: dict[int, dict] = {}
    cur = peak = baseline_bytes
    peak_at = -1
    baseline_freed = baseline_freed_at_peak = 0
    for i, e in enumerate(events):
        act = e.get("action")
        if act == "alloc":
            live[e["addr"]] = e
            cur += e["size"]
            if cur > peak:
                peak, peak_at, baseline_freed_at_peak = cur, i, baseline_freed
        elif act == "free_completed":
            if e.get("addr") in live:
                cur -= live.pop(e["addr"])["size"]
            else:   # allocated before the step (part of the baseline), released during it: the gradients of the
                cur -= e.get("size", 0)   # step before under set_to_none, say (FSDP's: 2.4 GiB for GPT 1.3B CP2)
                baseline_freed += e.get("size", 0)
    # the live set at the peak: replay again up to it (cheaper than copying the set at every new peak)
    at_peak: dict[int, dict] = {}
    for e in events[:peak_at + 1]:
        act = e.get("action")
        if act == "alloc":
            at_peak[e["addr"]] = e
        elif act == "free_completed":
            at_peak.pop(e.get("addr"), None)
    sites: dict[str, list[int]] = {}
    for e in at_peak.values():
        s = sites.setdefault(_site(e.get("frames") or []), [0, 0])
        s[0] += e["size"]
        s[1] += 1
    mib = 2.0 ** 20
    rows = sorted(sites.items(), key=lambda kv: -kv[1][0])
    return {"baseline_mib": round(baseline_bytes / mib, 2), "peak_mib": round(peak / mib, 2),
            "baseline_freed_before_peak_mib": round(baseline_freed_at_peak / mib, 2),
            "allocated_in_step_at_peak_mib": round((peak - baseline_bytes + baseline_freed_at_peak) / mib, 2),
            "events": len(events), "peak_event": peak_at,
            "at_peak": [{"mib": round(b / mib, 2), "tensors": n, "site": site} for site, (b, n) in rows[:top]],
            "at_peak_other_mib": round(sum(b for _, (b, _) in rows[top:]) / mib, 2)}


def record_step(fn, device_index: int):
    """Run fn() with the allocator's history recorded; returns (fn's result, peak_live summary)."""
    import torch

    torch.cuda.synchronize()
    baseline = torch.cuda.memory_allocated(device_index)
    torch.cuda.memory._record_memory_history(max_entries=MAX_ENTRIES, stacks="python")
    try:
        out = fn()
        torch.cuda.synchronize()
        snap = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    traces = snap.get("device_traces") or []
    events = traces[device_index] if device_index < len(traces) else []
    return out, peak_live(events, baseline)


def write(summary: dict, prefix: str, rank: int, extra: dict | None = None) -> Path:
    path = Path(f"{prefix}.rank{rank}.json")
    if path.exists():
        raise FileExistsError(f"'{path}' already exists; give another --memory-out")
    path.write_text(json.dumps({**(extra or {}), **summary}, indent=1) + "\n")
    return path
