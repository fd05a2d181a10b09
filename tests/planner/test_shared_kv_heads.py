"""Fewer KV heads than TP ranks in the planner: per-rank widths, weights, the replicated K/V gradients' TP
reduction, and the Megatron-LM export (query groups a multiple or a divisor of TP, the rest refused by name)."""
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


def test_megatron_export_takes_query_groups_a_divisor_of_tp():
    export = megatron_args(_plan(MQA, 4))
    assert export.value("--num-query-groups") == "1" and export.value("--group-query-attention") is True
    assert any("num_query_groups < TP" in n for n in export.notes)


def test_megatron_export_refuses_other_query_groups_by_name():
    model = tiny_model("llama", num_heads=12, num_kv_heads=3, hidden=96)
    with pytest.raises(PlanError, match="3 query groups .* multiple or a divisor of TP 4"):
        megatron_args(_plan(model, 4))
