"""The GEMM lookup off the profile's grid (planner/profile/table.py _gemm_s_cached): measured points stay exact, a line
is interpolated along only over a bracket of at most two octaves, and elsewhere a plane fitted to the nearest
points answers (a study of the lookup on 8,335 measured shapes, 2026-12-02, commit 175947e)."""
import math
from dataclasses import replace

import numpy as np
import pytest

from planner.profile import LINE_MAX_BRACKET_OCTAVES, _gemm_s_cached, _GemmTable

LAUNCH_S = 5e-6   # _gemm_s_cached adds it to every GEMM


def _points(rate_flops_per_s, shapes):
    return [(m, n, k, 2.0 * m * n * k / rate_flops_per_s(m, n, k)) for m, n, k in shapes]


def _device_s(profile, m, n, k):
    return profile.gemm_s(m, n, k) - LAUNCH_S


def _power_law_rate(m, n, k):
    return 500e12 * (m / 4096) ** 0.3 * (n / 4096) ** 0.2 * (k / 4096) ** 0.3


POWER_LAW_GRID = [(m, n, k) for m in (1024, 4096, 16384) for n in (1024, 4096, 16384) for k in (1024, 4096, 16384)]


def _idw4_s(points, m, n, k):
    """The lookup before commit 175947e off the grid's lines: inverse-distance weights (1 / squared distance in log2
    shape) on the log rates of the 4 nearest points."""
    shape = np.log2(np.array([p[:3] for p in points], dtype=float))
    log_rate = np.log([2.0 * a * b * c / t for a, b, c, t in points])
    dist2 = ((shape - np.log2([m, n, k])) ** 2).sum(axis=1)
    near = np.argsort(dist2)[:4]
    weight = 1.0 / dist2[near]
    return 2.0 * m * n * k / math.exp((weight * log_rate[near]).sum() / weight.sum())


def test_measured_points_stay_exact(profile):
    for m, n, k, t in profile.gemm_points[::37]:
        assert profile.gemm_s(m, n, k) == t + LAUNCH_S
    for m, n, k, t in profile.wgrad_points[::37]:
        assert profile.wgrad_s(m, n, k) == t + LAUNCH_S


def test_a_line_is_interpolated_along_only_within_two_octaves():
    assert LINE_MAX_BRACKET_OCTAVES == 2.0
    t512, t2048, t8192 = 1e-5, 2e-5, 3e-5   # rates 2mnk/t: log rate halfway between the ends' at the middle
    two_octaves = _GemmTable(((512, 512, 2048, t512), (512, 2048, 2048, t2048)), 4e12)
    want = (math.log(2 * 512 * 512 * 2048 / t512) + math.log(2 * 512 * 2048 * 2048 / t2048)) / 2
    assert two_octaves.along_line(512, 1024, 2048) == pytest.approx(want, rel=1e-12)
    four_octaves = _GemmTable(((512, 512, 2048, t512), (512, 8192, 2048, t8192)), 4e12)
    assert four_octaves.along_line(512, 2048, 2048) is None


def test_a_wide_bracket_reads_the_points_around_instead(profile):
    """A rate that saturates along n (n / (n + 1000)): across a four-octave bracket (n = 512 .. 8192) a straight
    line in log2 n reads 2048 about 22% slow; the plane over the points near n = 2048 is within 1%."""
    def rate(m, n, k):
        return 700e12 * n / (n + 1000) * (m / 512) ** 0.05 * (k / 2048) ** 0.05

    around = [(m, n, k) for m in (256, 512, 1024) for n in (1536, 1792, 2304, 2560) for k in (1024, 2048, 4096)
              if not (m == 512 and k == 2048)]
    synthetic = replace(profile, gemm_points=_points(rate, [(512, 512, 2048), (512, 8192, 2048)] + around))
    true_s = 2.0 * 512 * 2048 * 2048 / rate(512, 2048, 2048)
    old_line_s = 2.0 * 512 * 2048 * 2048 / math.sqrt(rate(512, 512, 2048) * rate(512, 8192, 2048))
    assert old_line_s / true_s - 1 > 0.2
    assert _device_s(synthetic, 512, 2048, 2048) == pytest.approx(true_s, rel=0.01)


def test_off_the_lines_a_power_law_is_read_where_nearest_neighbours_missed(profile):
    """Rates following a power law of m, n and k, measured on a sparse grid: a shape on none of its lines is read
    within 1% by the fitted plane; the 4-nearest inverse-distance weights (the lookup before) missed by over 5%."""
    synthetic = replace(profile, gemm_points=_points(_power_law_rate, POWER_LAW_GRID))
    m, n, k = 2048, 3072, 8192
    true_s = 2.0 * m * n * k / _power_law_rate(m, n, k)
    assert _device_s(synthetic, m, n, k) == pytest.approx(true_s, rel=0.01)
    assert abs(_idw4_s(synthetic.gemm_points, m, n, k) / true_s - 1) > 0.05


def test_the_plane_never_reads_a_rate_beyond_its_points(profile):
    """Far outside the measured shapes the plane would extrapolate the power law upwards; it stops at the fastest
    point it was fitted to."""
    synthetic = replace(profile, gemm_points=_points(_power_law_rate, POWER_LAW_GRID))
    m, n, k = 262144, 65536, 65536
    fastest = max(_power_law_rate(*s) for s in POWER_LAW_GRID)
    assert 2.0 * m * n * k / _device_s(synthetic, m, n, k) == pytest.approx(fastest, rel=1e-9)


def test_the_weight_gradient_table_reads_off_the_grid_the_same_way(profile):
    synthetic = replace(profile, wgrad_points=_points(_power_law_rate, POWER_LAW_GRID))
    m, n, k = 2048, 3072, 8192
    assert synthetic.wgrad_s(m, n, k) - LAUNCH_S == pytest.approx(2.0 * m * n * k / _power_law_rate(m, n, k),
                                                                   rel=0.01)


def test_an_off_grid_lookup_is_cached(profile):
    synthetic = replace(profile, gemm_points=_points(_power_law_rate, POWER_LAW_GRID))
    first = synthetic.gemm_s(2048, 3072, 6144)
    hits = _gemm_s_cached.cache_info().hits
    assert synthetic.gemm_s(2048, 3072, 6144) == first
    assert _gemm_s_cached.cache_info().hits == hits + 1
