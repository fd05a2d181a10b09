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
    micro-batch count (a reduce-scatter per micro-batch was 16 x 0.27 s). The target's DP overlap is set to hide
    nothing here, so that the traffic itself is what is counted."""
    from dataclasses import replace

    by_id, pr = rows
    row = by_id["llama3-02"]
    plan = pr.plan_row(row, replace(load_target("megatron"), dp_bucket_params=0.0, dp_hidden_fraction=0.0))
    m = row.model
    params_rank = (8 * m.layer_params() + m.embedding_params()) / 8
    hand_s = params_rank * (4 + 2) * 127 / 128 / 50e9
    dp_s = plan.prediction.breakdown_s["dp_comm"]
    assert 0.9 * hand_s < dp_s < 1.25 * hand_s, (dp_s, hand_s)


def test_megatron_backward_tp_collectives_beside_gemms_by_hand(profile):
    """With the TP overlap off, the megatron target leaves exposed the forward's gather and reduce-scatter and the
    backward's gather of the output gradient, and hides the backward's re-gather of the input and reduce-scatter of
    the input gradient behind the backward GEMMs (Megatron-LM's asynchronous backward collectives); a target
    without them (tp_backward_beside_gemms False) exposes all three backward collectives."""
    from dataclasses import replace

    from planner.cluster import ClusterSpec
    from planner.cost import CostModel
    from planner.cost.terms import BF16
    from planner.model import resolve_model
    from planner.plan import Layout, TrainingShape

    meg = load_target("megatron")
    assert meg.tp_backward_beside_gemms
    sync = replace(meg, tp_backward_beside_gemms=False)
    m = resolve_model("gpt-6.7b")
    lay = Layout(tp=2, micro_batch=2, sharding="none", overlap_tp=False, cuda_graph=False)
    args = (m, TrainingShape(2048, 8), lay, ClusterSpec(gpu="h200-sxm", num_gpus=2, gpus_per_node=2), profile)
    a, b = CostModel(*args, target=meg), CostModel(*args, target=sync)
    nbytes = BF16 * a.tokens * m.hidden
    ag = a.group_collective_s("all_gather", nbytes, 2, 1) * profile.eff("tp")
    rs = a.group_collective_s("reduce_scatter", nbytes, 2, 1) * profile.eff("tp")
    la, lb = a.layer, b.layer
    assert la.fwd_comm_s == pytest.approx(2 * (ag + rs), rel=1e-9)
    assert lb.fwd_comm_s == pytest.approx(2 * (ag + rs), rel=1e-9)
    assert lb.bwd_comm_s == pytest.approx(2 * (2 * ag + rs), rel=1e-9)
    assert la.bwd_comm_s == pytest.approx(2 * ag, rel=1e-9)  # the backward GEMMs outlast (ag + rs) twice over
    # with the overlap on, both hide at the target's fraction alike
    on = replace(lay, overlap_tp=True)
    args_on = (m, TrainingShape(2048, 8), on, args[3], profile)
    assert CostModel(*args_on, target=meg).layer.bwd_comm_s == CostModel(*args_on, target=sync).layer.bwd_comm_s


def test_korthikanti_rows_as_run(rows):
    """Korthikanti et al. 2022 (arXiv 2205.05198): Table 3 micro-batch 1; section 6 "the interleaving schedule with
    three interleaving stages (m = 3) for the 175B and 530B models"; Megatron-LM of 2022 has no TP overlap
    (--tp-comm-overlap came in 2023) but its asynchronous backward collectives; torchtitan and Narayanan 2021's
    Megatron-LM have neither."""
    by_id, pr = rows
    meg = load_target("megatron")
    for rid, vpp in (("kor22-01", 3), ("kor22-02", 3), ("kor22-03", 3), ("kor22-04", 3), ("kor22-05", 1),
                     ("kor22-06", 1)):
        pins = by_id[rid].pins
        assert (pins.vpp, pins.micro_batch, "tp" in pins.no_overlap) == (vpp, 1, True), rid
        assert pr.row_target(by_id[rid], meg).tp_backward_beside_gemms
    for rid in ("nar21-05", "titan24-04"):
        assert not pr.row_target(by_id[rid], meg).tp_backward_beside_gemms


def test_korthikanti_full_recompute_over_present_work(rows):
    """Section 6.3, Table 5: full recompute without sequence parallelism over sequence parallelism with selective
    recompute, iteration time 18.13 / 13.75 s (175B), 49.05 / 37.83 s (530B), 94.42 / 71.49 s (1T): the pinned
    plans' step times keep that ratio within 4%."""
    by_id, pr = rows
    meg = load_target("megatron")
    for full, sel, published in (("kor22-02", "kor22-01", 18.13 / 13.75), ("kor22-04", "kor22-03", 49.05 / 37.83),
                                 ("kor22-06", "kor22-05", 94.42 / 71.49)):
        ratio = pr.plan_row(by_id[full], meg).prediction.step_s / pr.plan_row(by_id[sel], meg).prediction.step_s
        assert ratio == pytest.approx(published, rel=0.04), (full, ratio, published)


def test_torchtitan_rows_as_run(rows):
    """torchtitan at commit 9dec370 (the benchmarked version): a local batch is one pass without PP and is split into
    PP-degree micro-batches with PP; with PP its FSDP2 does not re-shard after forward and PyTorch's pipeline stage
    reduces FSDP gradients on the last micro-batch only (one gather, one reduce-scatter a step: 'optimizer')."""
    by_id, _ = rows
    for rid, mb, sharding in (("titan24-01", 2, "full"), ("titan24-04", 16, "full"), ("titan24-06", 4, "optimizer"),
                              ("titan24-07", 4, "optimizer"), ("titan24-08", 1, "optimizer"),
                              ("titan24-11", 1, "optimizer")):
        pins = by_id[rid].pins
        assert (pins.micro_batch, pins.sharding) == (mb, sharding), rid


def test_megatron_rows_keep_megatrons_even_layer_split(rows):
    """Megatron splits the layers evenly over the pipeline's chunks unless told otherwise: GPT-OSS 120B's 36 layers
    over PP4 run 9 per stage, where the planner alone balances the 201K-vocabulary head (9/10/10/7); a row whose
    layers do not divide (Llama 3.1 405B's 126 over 64 chunks on Megatron-Bridge) keeps the planner's split, and a
    source that splits its own way (torchtitan) is not touched."""
    from planner.cost import CostModel
    from planner.search import search

    by_id, pr = rows
    t = load_target("megatron")
    row = by_id["mbridge-03"]
    planners = search(row.model, row.shape, row.cluster, row.profile(), row.pins, top_k=1,
                      target=pr.row_target(row, t)).plans[0]
    assert [s.layers for s in planners.stages] != [9, 9, 9, 9]
    gpt_oss = pr.plan_row(row, t)
    assert [s.layers for s in gpt_oss.stages] == [9, 9, 9, 9]
    # the prediction is that split's
    cm = CostModel(row.model, row.shape, gpt_oss.layout, row.cluster, row.profile(), target=pr.row_target(row, t))
    assert cm.predict(gpt_oss.stages).step_s == pytest.approx(gpt_oss.prediction.step_s, rel=1e-12)
    # a torchtitan row is returned as planned, whatever split it has
    assert pr.megatron_split(by_id["titan24-06"], planners, t, row.profile()) is planners
    # layers that do not divide: the planner's split stands
    llama = by_id["mbridge-02"]
    searched = search(llama.model, llama.shape, llama.cluster, llama.profile(), llama.pins, top_k=1,
                      target=pr.row_target(llama, t)).plans[0]
    assert [s.layers for s in pr.plan_row(llama, t).stages] == [s.layers for s in searched.stages]


def test_stages_with_layer_counts_fit_recompute_per_rank(profile):
    """A fixed split (planner.search.stages.stages_with_layer_counts) keeps its counts and recomputes only where a
    rank must to fit; with no room at all it says so (None)."""
    from planner import memory as mem
    from planner.cluster import ClusterSpec
    from planner.cost import CostModel
    from planner.model import resolve_model
    from planner.plan import Layout, TrainingShape
    from planner.search.stages import stages_with_layer_counts

    m, shape = resolve_model("gpt-1.3b"), TrainingShape(2048, 32)
    lay = Layout(pp=4, vpp=2, dp=1, micro_batch=2, sharding="none", cuda_graph=False)
    cm = CostModel(m, shape, lay, ClusterSpec(num_gpus=4), profile)
    counts = [4, 3, 2, 3, 3, 3, 4, 2]  # uneven, so that a stage read as another's shows
    roomy = stages_with_layer_counts(cm, shape, 1e15, counts)
    assert [s.layers for s in roomy] == counts and not any(s.full_recompute_layers or s.selective_recompute_layers
                                                           for s in roomy)
    full = stages_with_layer_counts(cm, shape, 1e15, counts, "full")
    assert all(s.full_recompute_layers == s.layers for s in full)
    need = max(cm.predict(roomy).memory_gib_per_rank) * mem.GIB
    tight = stages_with_layer_counts(cm, shape, 0.8 * need, counts)
    assert tight is not None and [s.layers for s in tight] == counts
    assert any(s.full_recompute_layers or s.selective_recompute_layers for s in tight)
    assert max(cm.predict(tight).memory_gib_per_rank) * mem.GIB <= 0.8 * need
    assert stages_with_layer_counts(cm, shape, 1e6, counts) is None
    # a runtime whose selective recompute frees nothing (DeepSeek-V3's FP8 activation cache) recomputes fully only
    from planner.cost.targets import RuntimeTarget
    cached = CostModel(m, shape, lay, ClusterSpec(num_gpus=4), profile,
                       target=RuntimeTarget("t", fp8_activation_cache=mem.Fp8ActivationCache()))
    need = max(cached.predict(stages_with_layer_counts(cached, shape, 1e15, counts)).memory_gib_per_rank) * mem.GIB
    squeezed = stages_with_layer_counts(cached, shape, 0.9 * need, counts)
    assert squeezed is not None and not any(s.selective_recompute_layers for s in squeezed)
    assert any(s.full_recompute_layers for s in squeezed)


def test_legacy_megatron_rows_priced_as_they_ran(rows):
    """Narayanan's and Korthikanti's Megatron-LM ran the attention core unfused and is priced at its own fitted
    kernel factor; rows of today's Megatron-Core keep the target's compute factor and a fused core."""
    by_id, pr = rows
    meg = load_target("megatron")
    for rid in ("nar21-01", "kor22-05"):
        t = pr.row_target(by_id[rid], meg)
        assert t.unfused_attention and t.compute_factor == meg.legacy_compute_factor, rid
    for rid in ("nemo2407-05", "mbridge-03", "titan24-01"):
        t = pr.row_target(by_id[rid], meg)
        assert not t.unfused_attention and t.compute_factor == meg.compute_factor, rid


def test_nemo_rows_count_apex_distributed_adam_states(rows):
    """NeMo 24.07's FP8 rows keep their states as Apex's DistributedFusedAdam with FP8 parameters does: 2 + 2 B a
    parameter on every rank and 8 B over the data-parallel ranks, 8 B at Nemotron-340B's DP 2 where ours (bf16
    gradients) holds 2 + 2 + 12 / 2 = 10 B; the other sources keep ours."""
    by_id, pr = rows
    meg = load_target("megatron")
    nemo = pr.row_target(by_id["nemo2407-08"], meg)
    assert nemo.state_storage == pr.APEX_ADAM_FP8_STORAGE
    for rid in ("mbridge-01", "titan24-06", "nar21-01"):
        assert pr.row_target(by_id[rid], meg).state_storage is None, rid
    row = by_id["nemo2407-08"]
    lay_dp = row.pins.dp
    assert pr.APEX_ADAM_FP8_STORAGE.per_param(lay_dp) == 2 + 2 + 8 / 2
