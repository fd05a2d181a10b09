"""Fewer KV heads than TP ranks in the planner: per-rank widths, weights, the replicated K/V gradients' TP
reduction; Megatron-Core needs query groups a multiple of TP (its TransformerConfig), so the export refuses the rest
by name and the megatron target's search does not plan them."""
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


@pytest.mark.parametrize("model,tp", [(MQA, 4), (tiny_model("llama", num_heads=12, num_kv_heads=3, hidden=96), 4)])
def test_megatron_export_refuses_other_query_groups_by_name(model, tp):
    kv = model.num_kv_heads
    with pytest.raises(PlanError, match=f"{kv} query groups \\(KV heads\\) to be a multiple of TP {tp}"):
        megatron_args(_plan(model, tp))


def test_megatron_target_plans_no_layout_with_fewer_query_groups_than_tp():
    from planner.cost.targets import OURS, load_target

    assert OURS.layout_refusal(MQA, Layout(tp=4)) is None
    why = load_target("megatron").layout_refusal(MQA, Layout(tp=4))
    assert why == "megatron needs the 1 KV heads (query groups) to be a multiple of TP 4 (Megatron-Core's TransformerConfig)"
    assert load_target("megatron").layout_refusal(MQA, Layout(tp=1)) is None
