"""Candidate quantization efficiencies q(m, n, k) in (0, 1] of an m x n output cut into tiles that run in waves
of `sms` (H200: 132 SMs). Used as log q: Table divides every measured point's rate by q(point) before
interpolating and multiplies the interpolated rate by q(query)."""
import math

SMS = 132


def tile_eff(m, n, bm, bn):
    """Useful fraction of the padded output: m x n over m, n rounded up to the tile."""
    return m * n / (math.ceil(m / bm) * bm * math.ceil(n / bn) * bn)


def wave_eff(m, n, bm, bn, sms=SMS):
    """Useful fraction of the issued waves: m x n over (whole waves of `sms` tiles) x tile area."""
    tiles = math.ceil(m / bm) * math.ceil(n / bn)
    return m * n / (math.ceil(tiles / sms) * sms * bm * bn)


def splitk_wave_eff(m, n, k, bm, bn, sms=SMS, min_k=512, max_split=8):
    """wave_eff where the k reduction may be split in s parts (s work units per output tile, each at least
    min_k deep) to fill the waves; the best s (the split's reduction not charged)."""
    tiles = math.ceil(m / bm) * math.ceil(n / bn)
    best_eff = 0.0
    for s in range(1, max_split + 1):
        if s > 1 and k / s < min_k:
            break
        best_eff = max(best_eff, m * n / (math.ceil(tiles * s / sms) * sms * bm * bn / s))
    return best_eff


TILES = {
    "T3": [(128, 128), (128, 256), (256, 128)],
    "T4": [(128, 128), (128, 256), (256, 128), (64, 128), (128, 64), (64, 256), (256, 64)],
}
"""Tile candidates (cuBLAS Hopper bf16 kernels): T3 the large tiles, T4 with the 64-wide ones."""

SINGLE_TILES = [(128, 128), (128, 256), (256, 128), (64, 128), (128, 64), (64, 256), (256, 64), (256, 256), (64, 64)]


def best(fn, tiles):
    """log of the best efficiency over the tile candidates (cuBLAS picks a good tile)."""
    return lambda m, n, k: math.log(max(fn(m, n, bm, bn) for bm, bn in tiles))


def damped(adj, alpha):
    """alpha x a log efficiency: the quantization term at a fraction of its modelled strength."""
    return lambda m, n, k: alpha * adj(m, n, k)
