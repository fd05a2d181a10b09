"""One test per rule of planner/legality.py."""
from __future__ import annotations

import pytest

from planner.errors import PlanError
from planner.legality import check_layout, check_recompute_name, layout_violation, stages_violation
from planner.model import tiny_model
from planner.plan import Layout, StagePlan, TrainingShape

GPT = tiny_model("gpt")                                   # 4 heads, ffn 128, vocab 256, 4 layers, 64 positions
LLAMA = tiny_model("llama")                               # 2 KV heads
MOE = tiny_model("llama", num_experts=4, top_k=2)
SHAPE = TrainingShape(seq_len=32, global_batch=8)


def why(model=GPT, shape=SHAPE, gpus=None, per_node=None, **lay):
    lay.setdefault("sharding", "none" if lay.get("dp", 1) * lay.get("cp", 1) == 1 else "optimizer")
    return layout_violation(model, shape, Layout(**lay), gpus, per_node)


def test_a_legal_layout_passes():
    assert why(tp=2, pp=2, dp=2, micro_batch=2) is None
    assert why(MOE, tp=2, dp=2, cp=2, ep=4, micro_batch=1) is None


@pytest.mark.parametrize("field", ["tp", "pp", "vpp", "dp", "cp", "ep", "micro_batch"])
def test_degrees_must_be_positive_integers(field):
    assert f"{field} must be a positive integer" in why(**{field: 0})


def test_sharding_name():
    assert "sharding 'zero4' is not one of" in why(dp=2, sharding="zero4")


def test_world_size_matches_gpus():
    assert "does not equal the 8 GPUs" in why(gpus=8, tp=2, dp=2)


def test_heads_divisible_by_tp():
    assert "4 attention heads are not divisible by TP 8" in why(tiny_model("gpt", ffn_hidden=256), tp=8)


def test_kv_heads_a_multiple_or_a_divisor_of_tp():
    """Fewer KV heads than TP ranks is legal where TP is a multiple of them (each KV head is replicated over the
    ranks that share it); any other count is refused by name."""
    assert why(LLAMA, tp=4) is None                                            # 2 KV heads, TP 4
    assert why(tiny_model("llama", num_kv_heads=1), tp=4) is None             # one KV head
    model = tiny_model("llama", num_heads=12, num_kv_heads=3, hidden=96)
    assert "3 KV heads are neither a multiple nor a divisor of TP 4" in why(model, tp=4)


def test_ffn_divisible_by_tp():
    assert "MLP width 130 is not divisible by TP 4" in why(tiny_model("gpt", ffn_hidden=130), tp=4)


def test_odd_vocabulary_is_padded_so_every_tp_degree_splits_it():
    """GPT-2's 50,257 ids: the embedding and output layer hold 50,304 rows (a multiple of 128), which TP 1-8 split."""
    odd = tiny_model("gpt", vocab_size=250)
    assert odd.padded_vocab == 256
    assert tiny_model("gpt", vocab_size=50257).padded_vocab == 50304
    assert tiny_model("gpt", vocab_size=256).padded_vocab == 256
    assert why(odd, tp=4) is None
    # the padded rows are counted: the embedding holds 256 rows of the hidden width
    assert odd.embedding_params() - tiny_model("gpt", vocab_size=256).embedding_params() == 0


def test_tp_stays_inside_a_node():
    assert "TP 4 would span nodes (2 GPUs per node)" in why(per_node=2, tp=4)


def test_virtual_stages_need_pp():
    assert "virtual stages need pipeline parallelism" in why(vpp=2)


def test_layers_fill_virtual_stages():
    assert "4 layers cannot fill 6 pipeline stages" in why(pp=3, vpp=2, micro_batch=1, shape=TrainingShape(32, 6))


def test_sequence_divisible_by_2_cp_tp():
    # 2*CP*TP = 2*4*2 = 16 does not divide 40; 2*4 = 8 does
    assert "sequence 40 is not divisible by 2*CP*TP = 16" in why(shape=TrainingShape(40, 8), cp=4, tp=2)
    assert why(shape=TrainingShape(40, 8), cp=4, micro_batch=1) is None


def test_sequence_divisible_by_tp_for_sequence_parallelism():
    assert "sequence 30 is not divisible by TP 4" in why(shape=TrainingShape(30, 8), tp=4)


def test_sequence_within_model_maximum():
    assert "sequence 128 exceeds the model's maximum 64" in why(shape=TrainingShape(128, 8))


def test_ep_needs_moe():
    assert "expert parallelism needs an MoE model" in why(dp=2, ep=2)


def test_experts_divisible_by_ep():
    assert "4 experts are not divisible by EP 3" in why(MOE, dp=3, ep=3, shape=TrainingShape(32, 6))


def test_ep_divides_dp_times_cp():
    assert "EP 4 does not divide DP*CP = 2" in why(MOE, dp=2, ep=4)


def test_global_batch_divisible_by_micro_batch_times_dp():
    assert "global batch 8 is not divisible by micro-batch x DP = 3*1" in why(micro_batch=3)
    assert "global batch 8 is not divisible by micro-batch x DP = 1*3" in why(dp=3)


def test_interleaved_needs_micro_batches_divisible_by_pp():
    # 6 / (1 * 1) = 6 micro-batches over PP 4
    assert "interleaved schedule needs micro-batches (6) divisible by PP 4" in why(
        tiny_model("gpt", num_layers=8), shape=TrainingShape(32, 6), pp=4, vpp=2)
    assert why(tiny_model("gpt", num_layers=8), shape=TrainingShape(32, 6), pp=4, vpp=1) is None


def test_sharding_needs_more_than_one_data_parallel_rank():
    assert "sharding 'optimizer' needs more than one data-parallel rank" in why(sharding="optimizer")
    assert "needs more than one data-parallel rank" in layout_violation(GPT, SHAPE, Layout())  # the default
    assert why(sharding="none") is None
    assert why(cp=2, sharding="full") is None  # context ranks shard too


def test_stage_rules():
    lay = Layout(pp=2)
    assert "3 stages given for PP 2 x VPP 1" in stages_violation(GPT, lay, [StagePlan(1)] * 3)
    assert "stages hold 5 layers, the model has 4" in stages_violation(GPT, lay, [StagePlan(2), StagePlan(3)])
    assert "stage 0 holds no layer" in stages_violation(GPT, lay, [StagePlan(0), StagePlan(4)])
    assert "stage 1 recomputes more layers than it holds" in stages_violation(GPT, lay, [StagePlan(2), StagePlan(2, 2, 1)])
    assert stages_violation(GPT, lay, [StagePlan(1, 1), StagePlan(3, 1, 2)]) is None


def test_check_layout_raises_one_sentence():
    with pytest.raises(PlanError, match=r"^illegal layout TP8 PP1 DP1: 4 attention heads"):
        check_layout(tiny_model("gpt", ffn_hidden=256), SHAPE, Layout(tp=8))
    with pytest.raises(PlanError, match="recompute 'some' is not one of none, selective, full"):
        check_recompute_name("some")


def test_full_sharding_with_expert_parallelism_is_refused():
    from planner.legality import layout_violation
    from planner.model import CATALOGUE
    from planner.plan import Layout, TrainingShape
    m = CATALOGUE["mixtral-8x7b"]
    why = layout_violation(m, TrainingShape(4096, 64), Layout(dp=8, ep=2, sharding="full"))
    assert why and "expert parallelism" in why
    assert layout_violation(m, TrainingShape(4096, 64), Layout(dp=8, ep=2, sharding="optimizer")) is None


def test_our_runtime_refuses_a_schedule_it_does_not_run():
    """DualPipe is priced for the megatron target only: legal in a plan for it, refused for our runtime (check_plan
    and `plan validate --simulate` both ask ours_violation)."""
    from planner.legality import ours_violation

    assert ours_violation(Layout(pp=2, dp=1)) is None
    assert why(pp=2, schedule="dualpipe") is None
    assert "our runtime does not run the DualPipe schedule" in ours_violation(Layout(pp=2, schedule="dualpipe"))


def test_fp8_needs_a_gpu_with_fp8_tensor_cores():
    """An A100 has no FP8 tensor cores (torch._scaled_mm needs Ada or Hopper): an FP8 layout for it is refused,
    not priced at twice the bf16 rate; Hopper kinds, the CPU runs and an unknown GPU pass."""
    lay = Layout(tp=2, dp=1, micro_batch=1, sharding="none", fp8=True)
    assert "FP8" in layout_violation(GPT, SHAPE, lay, gpu="a100-80gb") and "a100-80gb" in \
        layout_violation(GPT, SHAPE, lay, gpu="a100-80gb")
    for gpu in ("h200-sxm", "h100-sxm", "h100-96gb", "h800", "cpu", None):
        assert layout_violation(GPT, SHAPE, lay, gpu=gpu) is None, gpu
    assert layout_violation(GPT, SHAPE, Layout(tp=2, dp=1, micro_batch=1, sharding="none"), gpu="a100-80gb") is None


def test_fp8_on_an_a100_is_one_sentence_at_the_command_line():
    from tests.planner.conftest import assert_one_sentence_error, run_cli
    line = assert_one_sentence_error(*run_cli("--model", "gpt-1.3b", "--gpus", "8", "--gpu", "a100-80gb", "--fp8"))
    assert "FP8" in line and "a100-80gb" in line
