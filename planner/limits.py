"""The ranges every number the user gives must fall in (flags, cluster files, plan files, model configs), and the
argparse types that enforce them: a NaN, an infinity, a negative count or a count so large that the search would
run for minutes is refused in one sentence naming the limit, before any work."""
from __future__ import annotations

import argparse
import math

MAX_GPUS = 1 << 17
"""131,072 GPUs: beyond any cluster built; the search over a count's divisors stays within seconds below it."""
MAX_GPUS_PER_NODE = 1024
MAX_LAYERS = 4096
MAX_HIDDEN = 1 << 20
MAX_HEADS = 1 << 14
MAX_FFN = 1 << 22
MAX_VOCAB = 1 << 24
MAX_SEQ_LEN = 1 << 24
MAX_GLOBAL_BATCH = 1 << 24
MAX_EXPERTS = 1 << 14
MAX_STEPS = 1 << 31
MAX_NETWORK_GB_PER_S = 1e5
"""GB/s per GPU, one direction: 100 TB/s, far above any NIC."""
MAX_TFLOPS = 1e6
MAX_SECONDS = 1e7
"""About 116 days: a timeout or budget above it is a typo."""


def is_number(v) -> bool:
    """A finite int or float, not a bool. Every int is finite: one beyond float range (a 400-digit count) is a
    number, refused by the range check that follows rather than by an OverflowError here."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    return isinstance(v, int) or math.isfinite(v)


def is_whole(v) -> bool:
    """An int (not a bool), or a float with no fraction (JSON's 1e3)."""
    return is_number(v) and (isinstance(v, int) or v.is_integer())


def int_arg(name: str, lo: int = 1, hi: int = MAX_GPUS):
    """argparse type: a whole number in [lo, hi], or one sentence naming the bound."""
    def parse(s: str) -> int:
        try:
            v = int(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a whole number, got '{s}'") from None
        if v < lo:
            raise argparse.ArgumentTypeError(f"{name} must be at least {lo}, got {v}")
        if v > hi:
            raise argparse.ArgumentTypeError(f"{name} must be at most {hi}, got {v}")
        return v
    return parse


def float_arg(name: str, lo: float = 0.0, hi: float = math.inf, lo_open: bool = True):
    """argparse type: a finite number above lo (or at least lo when not lo_open) and at most hi."""
    def parse(s: str) -> float:
        try:
            v = float(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number, got '{s}'") from None
        if not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"{name} must be a finite number, got '{s}'")
        if v < lo or (lo_open and v == lo):
            raise argparse.ArgumentTypeError(f"{name} must be {'above' if lo_open else 'at least'} {lo:g}, got {v:g}")
        if v > hi:
            raise argparse.ArgumentTypeError(f"{name} must be at most {hi:g}, got {v:g}")
        return v
    return parse
