"""The host probe (runtime/profiler/host.py) on CPU: both depths are built once, timed in alternating rounds,
and the per-layer figure comes out positive and finite (a real runtime step of the probe model)."""
import math

import pytest
import torch

from runtime.profiler.spawn import run_spawned


def _one_figure(world, device):
    from planner.plan import Layout
    from runtime.profiler import host as H

    lay = Layout(micro_batch=1, sharding="none")
    calls = []
    real = H._ProbeRun.step

    def counted(self):
        calls.append(self.spec.num_layers)
        return real(self)

    H._ProbeRun.step = counted
    try:
        per_layer, ends = H._per_layer_s(lay, "none", device, with_ends=True)
    finally:
        H._ProbeRun.step = real
    return per_layer, ends, calls


def test_probe_alternates_depths_and_gives_a_positive_per_layer_time():
    from runtime.profiler import host as H

    per_layer, ends, calls = run_spawned(_one_figure, 1, False)
    assert 0 < per_layer < 1 and math.isfinite(ends) and ends >= 0
    lo, hi = H.DEPTHS
    timed = calls[2 * H.WARMUP_STEPS:]
    assert len(timed) == 2 * H.ROUNDS * H.STEPS_PER_ROUND
    # rounds alternate which depth goes first
    firsts = [timed[r * 2 * H.STEPS_PER_ROUND] for r in range(H.ROUNDS)]
    assert firsts == [lo, hi, lo][:H.ROUNDS]


def _figures_sharing_groups(world, device):
    from planner.plan import Layout
    from runtime.profiler import host as H

    dp = H._per_layer_s(Layout(dp=2, micro_batch=1, sharding="optimizer"), "none", device)
    fsdp = H._per_layer_s(Layout(dp=2, micro_batch=1, sharding="full"), "none", device)
    tp = H._per_layer_s(Layout(tp=2, micro_batch=1, sharding="none"), "none", device)
    return dp, fsdp, tp, sorted(k[:5] for k in H._GROUPS)


def test_figures_of_the_same_degrees_share_one_set_of_process_groups():
    # DP2 with ZeRO-1 and DP2 fully sharded reuse the DP2 groups; TP2 builds its own
    dp, fsdp, tp, keys = run_spawned(_figures_sharing_groups, 2, False)
    assert keys == [[1, 1, 2, 1, 1], [2, 1, 1, 1, 1]]
    assert all(0 < x < 1 and math.isfinite(x) for x in (dp, fsdp, tp))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without a GPU")
def test_cuda_probe_without_a_gpu_is_one_sentence(tmp_path, capsys):
    from runtime.profiler import host

    rc = host.main(["--profile", "h200-sxm", "--out", str(tmp_path / "new.json")])
    err = capsys.readouterr().err
    assert rc != 0 and "no CUDA GPU is visible" in err and "Traceback" not in err
    assert not (tmp_path / "new.json").exists()
