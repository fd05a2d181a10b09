"""Provenance of a profile: the machine, its software, its topology, the code that measured it."""
from __future__ import annotations

import datetime as _dt
import os
import platform
import subprocess
from pathlib import Path

import torch

from planner.provenance import cpu_model, git_commit  # noqa: F401  (git_commit re-exported: the profile's provenance)

REPO = Path(__file__).resolve().parents[2]


def _run(cmd: list[str], cwd: Path | None = None) -> str | None:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=20, cwd=cwd)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def describe(device: torch.device, gpus_used: int) -> dict:
    """Everything a reader needs to know where the numbers came from."""
    prov = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "device_type": device.type,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "host_cpu": platform.processor() or platform.machine(),
        # the host figures (runtime/profiler/host.py) depend on the CPU: record which one, and its load
        "host_cpu_model": cpu_model() or platform.processor() or None,
        "host_cpu_count": os.cpu_count(),
        "host_load_average": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
        "hostname": platform.node(),
        **git_commit(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        prov.update({
            "gpu_name": props.name,
            "gpu_count_visible": torch.cuda.device_count(),
            "gpus_used": gpus_used,
            "sm_count": props.multi_processor_count,
            "gpu_memory_bytes": props.total_memory,
            "l2_cache_bytes": getattr(props, "L2_cache_size", None),
            "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(),
            "nccl": ".".join(map(str, torch.cuda.nccl.version())) if hasattr(torch.cuda, "nccl") else None,
            "driver": _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]),
            "topology": _run(["nvidia-smi", "topo", "-m"]) or "unavailable (nvidia-smi topo -m failed)",
        })
        if prov["driver"]:
            prov["driver"] = prov["driver"].splitlines()[0]
    else:
        prov.update({"gpu_name": "cpu", "gpu_count_visible": 0, "gpus_used": gpus_used,
                     "cpu_threads_per_process": 1, "topology": "processes on one host (gloo over loopback)"})
    return prov


def gpu_power_state(device: torch.device) -> dict | None:
    """The GPU's SM clock, power draw and limit and its clock-event reasons now (nvidia-smi, through
    runtime/gpu_monitor.py), or None where nvidia-smi cannot tell. The profile records them under load at the
    power cap (timing.at_power_cap)."""
    from runtime.gpu_monitor import query_once

    if device.type != "cuda":
        return None
    uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
    s = query_once(f"GPU-{uuid}" if uuid is not None else None)
    if s is None:
        return None
    return {"sm_clock_mhz": s["sm_mhz"], "max_sm_clock_mhz": s["max_sm_mhz"], "power_w": s["power_w"],
            "power_limit_w": s["power_limit_w"],
            "clock_event_reasons": None if s["reasons"] is None else f"0x{s['reasons']:016x}"}
