"""TP2, DP2, TP2 x DP2 with recompute, gradient accumulation and every sharding level match one process."""
from tests.runtime.dist_util import run_workers
from tests.runtime.equiv import assert_close, reference, worker

MIXED = ["full", "selective", "none", "selective"]

CASES_2 = [
    ("gpt", dict(tp=2, micro_batch=2, sharding="none"), None),
    ("llama", dict(tp=2, micro_batch=2, sharding="none"), ["selective"] * 4),
    ("bert", dict(tp=2, micro_batch=4, sharding="none"), ["full"] * 4),
    ("gpt", dict(dp=2, micro_batch=2, sharding="none"), MIXED),
    ("llama", dict(dp=2, micro_batch=1, sharding="optimizer"), None),
    ("gpt", dict(dp=2, micro_batch=2, sharding="optimizer+grads"), None),
    ("bert", dict(dp=2, micro_batch=2, sharding="full"), ["selective"] * 4),
]

CASES_4 = [
    ("llama", dict(tp=2, dp=2, micro_batch=1, sharding="optimizer"), MIXED),
    ("llama", dict(tp=2, dp=2, micro_batch=2, sharding="optimizer", overlap_tp=False, overlap_dp=False), None),
    ("gpt", dict(tp=2, dp=2, micro_batch=2, sharding="optimizer+grads"), ["selective"] * 4),
    ("gpt", dict(tp=2, dp=2, micro_batch=2, sharding="full"), ["full"] * 4),
    ("bert", dict(tp=2, dp=2, micro_batch=1, sharding="none"), None),
]


def _check(cases, world):
    results = run_workers(worker, world, cases)
    refs = {}
    for (family, lay, modes), got in zip(cases, results):
        ref = refs.setdefault(family, reference(family))
        assert_close(ref, got, f"{family} {lay} {modes}")


def test_two_ranks_tp2_and_dp2():
    _check(CASES_2, 2)


def test_four_ranks_tp2_x_dp2():
    _check(CASES_4, 4)
