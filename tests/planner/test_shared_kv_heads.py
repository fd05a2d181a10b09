"""Fewer KV heads than TP ranks in the planner: per-rank widths, weights, the replicated K/V gradients' TP
reduction; for Megatron-LM, whose TransformerConfig takes query groups that are a multiple or a divisor of TP, the
export writes them (refusing the rest by name) and the megatron target prices its gather of the QKV output."""
import pytest

from planner import memory as mem
from planner.errors import PlanError
from planner.export import megatron_args
from planner.model import tiny_model
from planner.plan import Layout, Plan, StagePlan, TrainingShape

MQA = tiny_model("llama", num_kv_heads=1)          # 4 heads of 16, one KV head


def test_each_rank_computes_one_shared_kv_head():
    assert MQA.kv_heads_local(4) == 1 and MQA.qkv_width_local(4) == 16 + 2 * 16
    gqa = tiny_model("llama", num_heads=8, num_kv_heads=4)
    assert gqa.kv_heads_local(2) == 2 and gqa.qkv_width_local(2) == (gqa.q_width + 2 * gqa.kv_width) // 2
    assert gqa.kv_heads_local(8) == 1


def test_replicated_kv_weights_held_whole_and_reduced_over_tp():
    h = MQA.hidden
    # every rank holds its q rows and the whole K/V rows (runtime/parallel/tensor.py, SharedKVQKVLinear)
    assert MQA.qkv_weight_rows_local(4) == MQA.q_width / 4 + 2 * MQA.kv_width
    mlp = 3 * h * MQA.ffn_hidden / 4
    assert mem.layer_gemm_weights_local(MQA, 4) == h * (MQA.q_width / 4 + 2 * MQA.kv_width) + MQA.q_width * h / 4 + mlp
    kv = (MQA.num_layers, 2 * MQA.kv_width * h)
    assert kv in mem.tp_replicated_tensors(MQA, 1, MQA.num_layers, False, False, tp=4)
    assert kv not in mem.tp_replicated_tensors(MQA, 1, MQA.num_layers, False, False, tp=1)


def _plan(model, tp):
    return Plan(model=model, cluster={"gpu": "h200-sxm", "num_gpus": tp, "gpus_per_node": 8},
                training=TrainingShape(model.default_seq_len, 8), layout=Layout(tp=tp, micro_batch=1),
                stages=[StagePlan(model.num_layers)])


def test_megatron_export_takes_query_groups_a_multiple_of_tp():
    gqa = tiny_model("llama", num_heads=8, num_kv_heads=4)
    export = megatron_args(_plan(gqa, 2))
    assert export.value("--num-query-groups") == "4" and export.value("--group-query-attention") is True


def test_megatron_export_takes_query_groups_fewer_than_tp_with_its_version_note():
    export = megatron_args(_plan(MQA, 4))
    assert export.value("--num-query-groups") == "1" and export.value("--tensor-model-parallel-size") == "4"
    assert any("needs megatron-core 0.16.0 or later" in n for n in export.notes)
    gqa = tiny_model("llama", num_heads=8, num_kv_heads=4)
    assert not any("0.16.0" in n for n in megatron_args(_plan(gqa, 2)).notes)


def test_megatron_export_refuses_query_groups_neither_multiple_nor_divisor_of_tp():
    model = tiny_model("llama", num_heads=12, num_kv_heads=3, hidden=96)
    plan = _plan(model, 4)  # built by hand: planner/legality.py refuses this layout for every target
    with pytest.raises(PlanError, match="3 query groups \\(KV heads\\) to be a multiple or a divisor of TP 4"):
        megatron_args(plan)


def test_megatron_target_prices_the_gather_of_the_qkv_output(profile):
    """With one KV head at TP 4 the megatron target's QKV GEMM is (q + 2 kv) / 4 wide and its output is gathered
    across TP forward and reduce-scattered backward, exposed; ours computes its shared head's K and V instead and
    gathers nothing. With KV heads a multiple of TP the two agree on both."""
    from dataclasses import replace

    from planner.cluster import ClusterSpec
    from planner.cost import CostModel
    from planner.cost.targets import OURS, load_target
    from planner.model import resolve_model

    mqa = replace(resolve_model("llama3-8b"), num_kv_heads=1, name="llama3-8b-mqa")
    cluster = ClusterSpec(gpu="h200-sxm", num_gpus=4, gpus_per_node=8)
    megatron = load_target("megatron")

    def cm(target, model):
        return CostModel(model, TrainingShape(4096, 8), Layout(tp=4, micro_batch=1, sharding="none"), cluster,
                         profile, target=target)

    ours, meg = cm(OURS, mqa), cm(megatron, mqa)
    q, kv = mqa.q_width, mqa.kv_width
    assert ours.layer_gemms()[0][1] == q // 4 + 2 * kv and meg.layer_gemms()[0][1] == (q + 2 * kv) // 4
    qkv_bytes = 2 * 4096 * (q + 2 * kv)
    extra_f = meg.group_collective_s("all_gather", qkv_bytes, 4, 1) * profile.eff("tp")
    extra_b = meg.group_collective_s("reduce_scatter", qkv_bytes, 4, 1) * profile.eff("tp")
    no_gather = replace(megatron, qkv_output_gather=False)
    base_f, base_b = cm(no_gather, mqa)._tp_comm_s(1.0, 1.0)
    f, b = meg._tp_comm_s(1.0, 1.0)
    assert (f, b) == pytest.approx((base_f + extra_f, base_b + extra_b), rel=1e-12) and extra_f > 0
    gqa = resolve_model("llama3-8b")  # 8 KV heads: a multiple of TP 4, nothing gathered
    assert cm(megatron, gqa)._tp_comm_s(1.0, 1.0) == cm(no_gather, gqa)._tp_comm_s(1.0, 1.0)
    assert cm(megatron, gqa).layer_gemms() == cm(OURS, gqa).layer_gemms()


def test_megatron_target_plans_fewer_query_groups_than_tp():
    from dataclasses import replace

    from planner.cluster import ClusterSpec
    from planner.cost.targets import load_target
    from planner.model import resolve_model
    from planner.profile import load_profile
    from planner.search import Pins, search

    mqa = replace(resolve_model("llama3-8b"), num_kv_heads=1, name="llama3-8b-mqa")
    res = search(mqa, TrainingShape(4096, 64), ClusterSpec(gpu="h200-sxm", num_gpus=16, gpus_per_node=8),
                 load_profile(None, "h200-sxm"), Pins(tp=4), top_k=1, target=load_target("megatron"))
    plan = res.plans[0]
    assert plan.layout.tp == 4 and plan.runtime == "megatron"
    assert megatron_args(plan).value("--num-query-groups") == "1"
