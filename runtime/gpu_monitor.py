"""The GPUs' clock and power while plans run (`plan validate`): nvidia-smi sampling in the background.

Why: under sustained load a GPU runs at its power cap, below its boost clock, and how far below depends on the
work (an H200 at its 700 W cap holds 1485-1665 MHz, and a step's time moves 2-9% with it). A prediction that
misses by a few percent is easier to read next to the clock the GPU actually held.

`GpuMonitor` starts `nvidia-smi --query-gpu=... -lms 200` (the driver's own tool: no extra Python dependency)
writing to a temporary file and parses it afterwards; `summary(t0, t1)` condenses the samples of a time window
(the measured steps of one plan). Where nvidia-smi is missing or fails, everything returns None: the monitor is
a diagnostic, never a reason for validation to fail. Note: recent drivers report power.draw as a one-second
average, so the power of a window shorter than that lags.
"""
from __future__ import annotations

import datetime as _dt
import os
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path

FIELDS = ["timestamp", "index", "clocks.sm", "clocks.max.sm", "power.draw", "power.limit",
          "clocks_event_reasons.active"]
INTERVAL_MS = 200
SW_POWER_CAP = 0x4
"""nvidia-smi's clocks_event_reasons bit for the software power cap (NVML's nvmlClocksEventReasonSwPowerCap)."""


def visible_gpu_indexes(count: int, env: dict | None = None) -> list[int] | None:
    """nvidia-smi indexes of the first `count` GPUs a launched process sees: CUDA_VISIBLE_DEVICES' integers where
    it is set (None where it names GPUs by UUID, which this does not map), else 0..count-1."""
    vis = (env if env is not None else os.environ).get("CUDA_VISIBLE_DEVICES")
    if vis is None:
        return list(range(count))
    try:
        ids = [int(v) for v in vis.split(",") if v.strip()]
    except ValueError:
        return None
    return ids[:count]


def parse_line(line: str) -> dict | None:
    """One nvidia-smi CSV line of FIELDS (noheader, nounits) -> a sample with unix time; a value nvidia-smi cannot
    tell ('[N/A]') becomes None; None for a line of other fields or an unreadable time or index."""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) != len(FIELDS):
        return None

    def num(v):
        try:
            return float(v)
        except ValueError:
            return None

    try:
        t = _dt.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()  # nvidia-smi prints local time
        index = int(parts[1])
    except ValueError:
        return None
    try:
        reasons = int(parts[6], 16)
    except ValueError:
        reasons = None
    return {"t": t, "index": index, "sm_mhz": num(parts[2]), "max_sm_mhz": num(parts[3]), "power_w": num(parts[4]),
            "power_limit_w": num(parts[5]), "reasons": reasons}


def _query_command(exe: str) -> list[str]:
    return [exe, f"--query-gpu={','.join(FIELDS)}", "--format=csv,noheader,nounits"]


def query_once(gpu: str | None = None) -> dict | None:
    """One sample of GPU `gpu` (an nvidia-smi -i argument; default the first GPU), or None where nvidia-smi
    cannot tell."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    cmd = _query_command(exe) + (["-i", gpu] if gpu else [])
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = r.stdout.strip().splitlines() if r.returncode == 0 else []
    return parse_line(lines[0]) if lines else None


def parse_samples(text: str) -> list[dict]:
    """nvidia-smi CSV lines (noheader, nounits) -> samples with unix time; lines that do not parse in full are
    skipped."""
    samples = (parse_line(line) for line in text.splitlines())
    return [s for s in samples if s is not None and None not in s.values()]


def summarize(samples: list[dict], t0: float, t1: float, indexes: list[int] | None = None) -> dict | None:
    """Medians over the samples of [t0, t1] (of the given GPUs): SM clock, power, and the share of samples at the
    power cap; None without samples."""
    sel = [s for s in samples if t0 <= s["t"] <= t1 and (indexes is None or s["index"] in indexes)]
    if not sel:
        return None
    return {"gpus": sorted({s["index"] for s in sel}), "samples": len(sel),
            "sm_clock_mhz": statistics.median(s["sm_mhz"] for s in sel),
            "max_sm_clock_mhz": max(s["max_sm_mhz"] for s in sel),
            "power_w": statistics.median(s["power_w"] for s in sel),
            "power_limit_w": statistics.median(s["power_limit_w"] for s in sel),
            "power_capped_share": sum(1 for s in sel if s["reasons"] & SW_POWER_CAP) / len(sel)}


def describe(state: dict | None) -> str | None:
    """One line for the validate report."""
    if not state:
        return None
    return (f"GPU during the measured steps: SM clock {state['sm_clock_mhz']:.0f} of {state['max_sm_clock_mhz']:.0f} "
            f"MHz, {state['power_w']:.0f} of {state['power_limit_w']:.0f} W, at the power cap in "
            f"{state['power_capped_share']:.0%} of {state['samples']} samples (median over GPUs "
            f"{','.join(map(str, state['gpus']))}; nvidia-smi every {INTERVAL_MS} ms)")


class GpuMonitor:
    """Samples every GPU with nvidia-smi from __enter__ to __exit__; samples() parses what was written."""

    def __init__(self):
        self.proc = None
        self.path = None

    def __enter__(self):
        exe = shutil.which("nvidia-smi")
        if exe is None:
            return self
        fd, path = tempfile.mkstemp(prefix="plan-gpu-", suffix=".csv")
        os.close(fd)
        self.path = Path(path)
        with open(self.path, "w") as out:
            try:
                self.proc = subprocess.Popen(_query_command(exe) + ["-lms", str(INTERVAL_MS)], stdout=out,
                                             stderr=subprocess.DEVNULL)
            except OSError:
                self.proc = None
        return self

    def __exit__(self, *exc):
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return False

    def samples(self) -> list[dict]:
        if self.path is None or not self.path.exists():
            return []
        try:
            return parse_samples(self.path.read_text())
        finally:
            self.path.unlink(missing_ok=True)
            self.path = None
