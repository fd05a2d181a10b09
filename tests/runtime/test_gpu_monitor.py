"""runtime/gpu_monitor.py: nvidia-smi samples parsed, summarised over the measured steps' window, and nothing
when nvidia-smi is missing; plan validate's steady-state window from the per-step CSV."""
import datetime

import pytest

from runtime import gpu_monitor
from runtime.validate import _steady


def _line(t: float, index: int, sm: float, power: float, reasons: int) -> str:
    stamp = datetime.datetime.fromtimestamp(t).strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]
    return f"{stamp}, {index}, {sm:.0f}, 1980, {power:.2f}, 700.00, 0x{reasons:016x}"


def test_samples_are_parsed_and_summarised_over_the_window():
    t0 = 1_800_000_000.0
    lines = [_line(t0 + 0.2 * i, i % 2, 1980 if i < 10 else 1500 + (i % 2) * 100, 300 if i < 10 else 690,
                   0x1 if i < 10 else 0x4) for i in range(40)]
    text = "\n".join(lines + ["garbage line", "", "2026/13/45 99:99:99.000, 0, 1, 2, 3, 4, 0x0"])
    samples = gpu_monitor.parse_samples(text)
    assert len(samples) == 40
    assert samples[0]["t"] == pytest.approx(t0, abs=1e-3) and samples[0]["reasons"] == 1
    st = gpu_monitor.summarize(samples, t0 + 2.0, t0 + 8.0)          # after the clock came down
    assert st["power_capped_share"] == 1.0 and st["power_w"] == 690 and st["gpus"] == [0, 1]
    assert st["sm_clock_mhz"] == pytest.approx(1550)                  # median over both GPUs
    only0 = gpu_monitor.summarize(samples, t0 + 2.0, t0 + 8.0, indexes=[0])
    assert only0["sm_clock_mhz"] == 1500 and only0["gpus"] == [0]
    early = gpu_monitor.summarize(samples, t0, t0 + 1.0)
    assert early["power_capped_share"] == 0.0 and early["sm_clock_mhz"] == 1980
    assert gpu_monitor.summarize(samples, t0 + 100, t0 + 200) is None
    line = gpu_monitor.describe(st)
    assert "1550 of 1980 MHz" in line and "690 of 700 W" in line and "100%" in line
    assert gpu_monitor.describe(None) is None


def test_visible_gpu_indexes():
    assert gpu_monitor.visible_gpu_indexes(2, {}) == [0, 1]
    assert gpu_monitor.visible_gpu_indexes(2, {"CUDA_VISIBLE_DEVICES": "3,5,6"}) == [3, 5]
    assert gpu_monitor.visible_gpu_indexes(1, {"CUDA_VISIBLE_DEVICES": "GPU-af99"}) is None


def test_no_nvidia_smi_means_no_samples(monkeypatch):
    monkeypatch.setattr(gpu_monitor.shutil, "which", lambda name: None)
    with gpu_monitor.GpuMonitor() as mon:
        pass
    assert mon.samples() == []


def test_steady_window_spans_the_measured_steps():
    rows = [{"step": str(i), "step_s": "0.5", "end_unix_s": f"{100 + 0.5 * i:.3f}"} for i in range(1, 7)]
    meas = _steady(rows, 2)
    assert meas["window_unix_s"] == (pytest.approx(101.0), pytest.approx(103.0))   # end of step 2 .. end of step 6
    assert _steady(rows, 0)["window_unix_s"] == (pytest.approx(100.0), pytest.approx(103.0))
    old = [{k: v for k, v in r.items() if k != "end_unix_s"} for r in rows]   # a CSV from before the column
    assert _steady(old, 2)["window_unix_s"] is None
