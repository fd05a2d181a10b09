"""What is alive at a step's memory peak (runtime/memory_trace.py): the replay of allocator events by hand, and
`plan launch --memory-step` refusals in one sentence."""
import pytest

from runtime.memory_trace import peak_live, write


def _ev(action, addr, size=0, where="model.py", line=1):
    return {"action": action, "addr": addr, "size": size,
            "frames": [{"filename": "/x/torch/nn/functional.py", "line": 9, "name": "linear"},
                       {"filename": f"/repo/runtime/{where}", "line": line, "name": "forward"}]}


def test_peak_and_what_is_alive_there_by_hand():
    mib = 2 ** 20
    events = [_ev("alloc", 1, 4 * mib, "model.py", 10),        # 4 live
              _ev("alloc", 2, 2 * mib, "model.py", 10),        # 6
              _ev("free_requested", 1),                         # still 6: not released yet
              _ev("free_completed", 1),                         # 2
              _ev("alloc", 3, 8 * mib, "cross_entropy.py", 5),  # 10: the peak
              _ev("alloc", 4, 1 * mib, "model.py", 20),         # 11: higher
              _ev("free_completed", 3),                         # 3
              _ev("alloc", 5, 3 * mib, "model.py", 30)]         # 6
    out = peak_live(events, baseline_bytes=100 * mib)
    assert out["peak_mib"] == 111 and out["baseline_mib"] == 100 and out["allocated_in_step_at_peak_mib"] == 11
    assert out["peak_event"] == 5
    sites = {r["site"]: (r["mib"], r["tensors"]) for r in out["at_peak"]}
    assert sites == {"cross_entropy.py:5 forward": (8, 1), "model.py:10 forward": (2, 1), "model.py:20 forward": (1, 1)}
    assert [r["mib"] for r in out["at_peak"]] == [8, 2, 1]            # largest first


def test_blocks_from_before_the_step_freed_during_it_lower_the_total():
    """Last step's gradients (in the baseline, allocated before recording) freed early in this step: the peak is
    baseline - freed + what the step allocated, not baseline + what the step allocated."""
    mib = 2 ** 20
    events = [_ev("alloc", 1, 4 * mib),                          # 104
              {**_ev("free_completed", 99), "size": 10 * mib},   # 94: a block of the baseline released
              _ev("alloc", 2, 8 * mib),                          # 102: the peak
              _ev("free_completed", 2)]                          # 94
    out = peak_live(events, baseline_bytes=100 * mib)
    assert out["peak_mib"] == 104 and out["peak_event"] == 0   # the first alloc stays the highest point
    events.insert(3, _ev("alloc", 3, 9 * mib))                   # 111: a new peak after the release
    out = peak_live(events, baseline_bytes=100 * mib)
    assert out["peak_mib"] == 111 and out["baseline_freed_before_peak_mib"] == 10
    assert out["allocated_in_step_at_peak_mib"] == 21            # 4 + 8 + 9 alive at the peak
    assert sum(r["mib"] for r in out["at_peak"]) == 21


def test_no_events_is_the_baseline():
    out = peak_live([], baseline_bytes=2 ** 30)
    assert out["peak_mib"] == 1024 and out["at_peak"] == []


def test_existing_output_is_not_overwritten(tmp_path):
    prefix = str(tmp_path / "mem")
    path = write({"peak_mib": 1}, prefix, 0)
    assert path.read_text().strip().startswith("{")
    with pytest.raises(FileExistsError, match="already exists"):
        write({"peak_mib": 2}, prefix, 0)


def test_launch_refuses_a_memory_step_it_cannot_record(tmp_path, capsys):
    from runtime.launch import main
    from tests.runtime.test_launch import write_plan

    plan = write_plan(tmp_path / "p.json", tp=1, dp=1, micro_batch=2, sharding="none")
    base = [str(plan), "--nproc-per-node", "1", "--steps", "3"]
    assert main(base + ["--device", "cpu", "--memory-step", "2", "--memory-out", str(tmp_path / "m")]) != 0
    err = capsys.readouterr().err.strip()
    assert "needs --device cuda" in err and "\n" not in err
    assert main(base + ["--device", "cpu", "--memory-step", "2"]) != 0
    assert "go together" in capsys.readouterr().err
