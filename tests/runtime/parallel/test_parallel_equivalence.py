"""TP2, DP2, TP2 x DP2 with recompute, gradient accumulation and every sharding level match one process."""
from tests.runtime.dist_util import run_workers
from planner.model import tiny_model
from planner.plan import Layout
from runtime.mesh import build_groups
from runtime.parallel import distributed_optimizer
from tests.runtime.equiv import assert_close, assert_close_bf16_grads, reference, run_case, worker

MIXED = ["full", "selective", "none", "selective"]

CASES_2 = [
    ("gpt", dict(tp=2, micro_batch=2, sharding="none"), None),
    ("llama", dict(tp=2, micro_batch=2, sharding="none"), ["selective"] * 4),
    ("bert", dict(tp=2, micro_batch=4, sharding="none"), ["full"] * 4),
    ("gpt", dict(dp=2, micro_batch=2, sharding="none"), MIXED),
    ("llama", dict(dp=2, micro_batch=1, sharding="optimizer"), None),
    ("gpt", dict(dp=2, micro_batch=2, sharding="optimizer+grads"), None),
    ("bert", dict(dp=2, micro_batch=2, sharding="full"), ["selective"] * 4),
    # Qwen2-style q/k/v biases (column-parallel, split by heads like the weight), and Llama's attention_bias
    # (q/k/v and the row-parallel output projection's), drawn nonzero by equiv.run_case
    ("llama+qkv_bias", dict(tp=2, micro_batch=2, sharding="none"), None),
    ("llama+qkv_bias+attn_out_bias", dict(tp=2, micro_batch=2, sharding="none", overlap_tp=False), ["selective"] * 4),
    # Qwen3's per-head q/k norms (weights whole on each TP rank, their gradients summed over TP), with a head
    # dimension that is not hidden / heads; selective recompute reruns them inside the checkpointed attention core
    ("llama+qk_norm+head_dim_override=24", dict(tp=2, micro_batch=2, sharding="none"), None),
    ("llama+qk_norm+head_dim_override=24", dict(tp=2, micro_batch=2, sharding="none"), ["selective"] * 4),
]

CASES_4 = [
    ("llama", dict(tp=2, dp=2, micro_batch=1, sharding="optimizer"), MIXED),
    ("llama", dict(tp=2, dp=2, micro_batch=2, sharding="optimizer", overlap_tp=False, overlap_dp=False), None),
    ("gpt", dict(tp=2, dp=2, micro_batch=2, sharding="optimizer+grads"), ["selective"] * 4),
    ("gpt", dict(tp=2, dp=2, micro_batch=2, sharding="full"), ["full"] * 4),
    ("bert", dict(tp=2, dp=2, micro_batch=1, sharding="none"), None),
    ("llama+qkv_bias+attn_out_bias", dict(tp=2, dp=2, micro_batch=1, sharding="optimizer"), MIXED),
    ("llama+qk_norm+head_dim_override=24", dict(tp=2, dp=2, micro_batch=1, sharding="optimizer"), MIXED),
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


CASES_BF16 = [   # bf16 main gradients and reductions (Layout.grad_dtype), with gradient accumulation
    ("gpt", dict(dp=2, micro_batch=1, sharding="optimizer", grad_dtype="bf16"), None),
    ("llama", dict(dp=2, micro_batch=1, sharding="none", grad_dtype="bf16"), ["selective"] * 4),
    ("gpt", dict(dp=2, micro_batch=1, sharding="optimizer+grads", grad_dtype="bf16"), None),
    ("llama", dict(dp=2, micro_batch=2, sharding="full", grad_dtype="bf16"), None),
    ("bert", dict(tp=2, micro_batch=2, sharding="none", grad_dtype="bf16"), None),
]


def _bf16_worker(rank, world, cases):
    """run_case, and the dtypes the optimizer keeps its gradients and reduces them in."""
    out = []
    for family, lay_kw, modes in cases:
        spec, lay = tiny_model(family), Layout(**lay_kw)
        seen = []
        real_rs = distributed_optimizer._rs

        def spy(output, input, *a, **kw):  # the reduction's precision, as issued
            seen.append(input.dtype)
            return real_rs(output, input, *a, **kw)
        distributed_optimizer._rs = spy
        try:
            got = run_case(spec, lay, build_groups(lay, "cpu"), modes or ["none"] * spec.num_layers)
        finally:
            distributed_optimizer._rs = real_rs
        out.append((got, sorted({str(d) for d in seen})))
    return out


def test_bf16_main_gradients_match_one_process_within_bf16():
    results = run_workers(_bf16_worker, 2, CASES_BF16)
    refs = {}
    for (family, lay, modes), (got, rs_dtypes) in zip(CASES_BF16, results):
        ref = refs.setdefault(family, reference(family))
        assert_close_bf16_grads(ref, got, f"{family} {lay} {modes}")
        if lay.get("sharding") in ("optimizer", "optimizer+grads"):
            assert rs_dtypes == ["torch.bfloat16"], f"{family} {lay}: reduce-scatter in {rs_dtypes}"
