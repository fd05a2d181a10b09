"""The host probe (runtime/profiler/host.py) on CPU: both depths are built once, timed in alternating rounds,
and the per-layer figure comes out positive and finite (a real runtime step of the probe model)."""
import math

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
