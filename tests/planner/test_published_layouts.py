"""Published runs (benchmarks/published/runs.csv) planned with the layout their source says was run, and the cost
model's price of that layout against a hand count of its traffic."""
from __future__ import annotations

import sys

import pytest

from planner.cost.targets import load_target
from tests.planner.conftest import REPO


@pytest.fixture(scope="module")
def rows():
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import published_rows
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    return {r.row_id: r for r in published_rows.load_rows()}, published_rows


def test_llama3_fsdp_planned_as_one_gather_and_one_reduction_per_step(rows):
    """Llama 3 (arXiv 2407.21783, section 3.3.2): parameters not re-sharded after forward, gradients accumulated in
    fp32 over the micro-batches and reduce-scattered in fp32: per step one fp32 reduce-scatter and one bf16
    all-gather of the rank's parameters, the distributed optimizer's schedule (sharding 'optimizer')."""
    by_id, _ = rows
    for rid in ("llama3-01", "llama3-02", "llama3-03"):
        pins = by_id[rid].pins
        assert (pins.sharding, pins.grad_dtype) == ("optimizer", "fp32"), rid


def test_llama3_16k_gpu_dp_traffic_by_hand(rows):
    """llama3-02 (TP8 PP16 DP128, 16 micro-batches of one sequence): the exposed DP time is one reduce-scatter of
    4 B and one all-gather of 2 B per parameter of the largest rank (8 of the 126 layers and the embedding, over
    TP8: about 3.4e9) across 128 nodes at 50 GB/s per GPU: 3.4e9 x 6 B x 127/128 / 50e9 = 0.41 s, whatever the
    micro-batch count (a reduce-scatter per micro-batch was 16 x 0.27 s)."""
    by_id, pr = rows
    row = by_id["llama3-02"]
    plan = pr.plan_row(row, load_target("megatron"))
    m = row.model
    params_rank = (8 * m.layer_params() + m.embedding_params()) / 8
    hand_s = params_rank * (4 + 2) * 127 / 128 / 50e9
    dp_s = plan.prediction.breakdown_s["dp_comm"]
    assert 0.9 * hand_s < dp_s < 1.25 * hand_s, (dp_s, hand_s)
