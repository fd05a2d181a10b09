"""`plan export`: Megatron-LM arguments checked against the plan for several layouts; torchrun and Slurm
outputs carry the plan's world size and node count; a bad plan file gives one sentence."""
import json
import subprocess
import sys

import pytest

from planner.cli import main as cli_main
from planner.export_megatron import _layout_string, megatron_args
from planner.model import CATALOGUE, tiny_model
from planner.plan import Layout, Plan, StagePlan, TrainingShape, even_stages
from tests.planner.conftest import REPO


def make_plan(model, stages=None, gb=64, seq=None, **lay):
    layout = Layout(**lay)
    stages = stages or even_stages(model.num_layers, layout.pp * layout.vpp)
    return Plan(model=model, cluster={"gpu": "h200-sxm", "num_gpus": layout.world_size, "gpus_per_node": 8},
                training=TrainingShape(seq or model.default_seq_len, gb), layout=layout, stages=stages)


def write(tmp_path, plan, name="p.json"):
    p = tmp_path / name
    p.write_text(json.dumps(plan.to_dict()))
    return p


def test_llama_gqa_swiglu_tp_pp_vpp_uniform_full_recompute():
    m = CATALOGUE["llama3-8b"]
    plan = make_plan(m, even_stages(32, 8, "full"), gb=512, tp=4, pp=4, vpp=2, dp=2, micro_batch=1)
    ex = megatron_args(plan)
    v = ex.value
    assert v("--tensor-model-parallel-size") == "4" and v("--sequence-parallel") is True
    assert v("--pipeline-model-parallel-size") == "4"
    assert v("--num-layers-per-virtual-pipeline-stage") == "4"
    assert v("--pipeline-model-parallel-layout") is None
    assert v("--micro-batch-size") == "1" and v("--global-batch-size") == "512"
    assert (v("--recompute-granularity"), v("--recompute-method"), v("--recompute-num-layers")) == ("full", "uniform", "1")
    assert v("--group-query-attention") is True and v("--num-query-groups") == "8"
    assert v("--swiglu") is True and v("--normalization") == "RMSNorm" and v("--position-embedding-type") == "rope"
    assert v("--untie-embeddings-and-output-weights") is True and v("--disable-bias-linear") is True
    assert (v("--num-layers"), v("--hidden-size"), v("--ffn-hidden-size"), v("--num-attention-heads")) == \
        ("32", "4096", "14336", "32")
    assert v("--seq-length") == "8192" and v("--bf16") is True
    assert v("--use-distributed-optimizer") is True and v("--overlap-grad-reduce") is True
    assert v("--overlap-param-gather") is True and v("--tp-comm-overlap") is True
    assert v("--context-parallel-size") is None and v("--num-experts") is None


def test_gpt_dense_no_pp_selective_and_no_gqa():
    m = CATALOGUE["gpt-1.3b"]
    plan = make_plan(m, even_stages(24, 1, "selective"), gb=64, tp=2, dp=4, micro_batch=4, sharding="none")
    v = megatron_args(plan).value
    assert v("--recompute-granularity") == "selective" and v("--recompute-method") is None
    assert v("--recompute-modules") == ["core_attn", "layernorm"]
    assert v("--group-query-attention") is None and v("--swiglu") is None
    assert v("--normalization") == "LayerNorm" and v("--position-embedding-type") == "learned_absolute"
    assert v("--untie-embeddings-and-output-weights") is None and v("--disable-bias-linear") is None
    assert v("--use-distributed-optimizer") is None and v("--overlap-param-gather") is None
    assert v("--overlap-grad-reduce") is True
    assert v("--pipeline-model-parallel-size") == "1"


def test_context_and_expert_parallel():
    m = CATALOGUE["mixtral-8x7b"]
    plan = make_plan(m, gb=256, tp=2, pp=2, dp=4, cp=2, ep=4, micro_batch=1)
    v = megatron_args(plan).value
    assert v("--context-parallel-size") == "2" and v("--cp-comm-type") == "p2p"
    assert v("--num-experts") == "8" and v("--moe-router-topk") == "2"
    assert v("--expert-model-parallel-size") == "4" and v("--expert-tensor-parallel-size") == "1"
    assert v("--recompute-granularity") is None


def test_uneven_ends_use_first_last_and_interior_uses_layout():
    m = tiny_model("gpt", num_layers=12)
    ends = make_plan(m, [StagePlan(2), StagePlan(4), StagePlan(4), StagePlan(2)], gb=8, pp=4, dp=1, micro_batch=1)
    v = megatron_args(ends).value
    assert v("--decoder-first-pipeline-num-layers") == "2" and v("--decoder-last-pipeline-num-layers") == "2"
    assert v("--pipeline-model-parallel-layout") is None
    inner = make_plan(m, [StagePlan(3), StagePlan(2), StagePlan(4), StagePlan(3)], gb=8, pp=4, dp=1, micro_batch=1)
    ex = megatron_args(inner)
    assert ex.value("--pipeline-model-parallel-layout") == "Et*3|t*2|t*4|t*3L"
    assert ex.value("--decoder-first-pipeline-num-layers") is None
    assert any("non-uniform split" in n for n in ex.notes)
    # interleaved, non-uniform: the layout lists virtual stages in model order (stage j on rank j % pp)
    vpp = make_plan(m, [StagePlan(n) for n in (1, 2, 2, 2, 2, 3)], gb=8, pp=2, vpp=3, dp=1, micro_batch=1)
    assert megatron_args(vpp).value("--pipeline-model-parallel-layout") == "Et|t*2|t*2|t*2|t*2|t*3L"
    assert _layout_string([1]) == "EtL"


def test_per_stage_recompute_maps_to_block_and_says_so():
    m = tiny_model("llama", num_layers=8)
    st = [StagePlan(4, full_recompute_layers=3), StagePlan(4, full_recompute_layers=1, selective_recompute_layers=1)]
    ex = megatron_args(make_plan(m, st, gb=8, pp=2, dp=1, micro_batch=1))
    v = ex.value
    # at least as much as planned on every stage: 3 full on stage 0, 1 full + 1 selective on stage 1
    assert (v("--recompute-granularity"), v("--recompute-method"), v("--recompute-num-layers")) == ("full", "block", "3")
    assert any("per-stage recompute differs" in n for n in ex.notes)
    uniform_block = [StagePlan(4, full_recompute_layers=2), StagePlan(4, full_recompute_layers=2)]
    ex2 = megatron_args(make_plan(m, uniform_block, gb=8, pp=2, dp=1, micro_batch=1))
    assert ex2.value("--recompute-method") == "block" and ex2.value("--recompute-num-layers") == "2"
    assert not any("per-stage recompute" in n for n in ex2.notes)


def test_zero3_and_non_overlap_are_noted():
    m = CATALOGUE["gpt-1.3b"]
    plan = make_plan(m, gb=64, tp=1, pp=2, dp=4, micro_batch=1, sharding="full", overlap_pp=False)
    ex = megatron_args(plan)
    assert ex.value("--use-megatron-fsdp") is True
    assert ex.value("--data-parallel-sharding-strategy") == "optim_grads_params"
    assert ex.value("--no-overlap-p2p-communication") is True
    assert any("ZeRO-3" in n for n in ex.notes)


def test_cli_megatron_output_is_a_bash_array(tmp_path, capsys):
    p = write(tmp_path, make_plan(CATALOGUE["llama3-8b"], gb=512, tp=2, pp=2, dp=2, micro_batch=1))
    assert cli_main(["export", str(p), "--to", "megatron"]) == 0
    out = capsys.readouterr().out
    assert "MEGATRON_ARGS=(" in out and "megatron/training/arguments.py" in out
    r = subprocess.run(["bash", "-n"], input=out, text=True, capture_output=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run(["bash", "-c", out + '\necho "${MEGATRON_ARGS[@]}"'], text=True, capture_output=True)
    assert "--tensor-model-parallel-size 2" in r.stdout


def test_torchrun_is_plan_launch_command(tmp_path, capsys):
    p = write(tmp_path, make_plan(tiny_model("gpt"), gb=8, tp=2, dp=2, micro_batch=1))
    assert cli_main(["export", str(p), "--to", "torchrun"]) == 0
    out = capsys.readouterr().out
    assert "--nproc-per-node=4" in out and "--nnodes=1" in out and "--standalone" in out
    # several nodes: world 32 on 4 nodes of 8
    p2 = write(tmp_path, make_plan(CATALOGUE["gpt-1.3b"], gb=64, tp=2, pp=2, dp=8, micro_batch=1), "p2.json")
    assert cli_main(["export", str(p2), "--to", "torchrun", "--rdzv-endpoint", "n0:29500", "--node-rank", "2"]) == 0
    out = capsys.readouterr().out
    assert "--nproc-per-node=8" in out and "--nnodes=4" in out and "--node-rank=2" in out
    assert "--rdzv-endpoint=n0:29500" in out


def test_torchrun_matches_launch_dry_run(tmp_path, capsys):
    p = write(tmp_path, make_plan(tiny_model("gpt"), gb=8, tp=2, dp=1, micro_batch=1, sharding="none"))
    assert cli_main(["export", str(p), "--to", "torchrun", "--device-free-check"]) != 0  # unknown option: one sentence
    capsys.readouterr()
    assert cli_main(["export", str(p), "--to", "torchrun"]) == 0
    exported = capsys.readouterr().out.splitlines()[-1]
    from runtime.launch import main as launch_main
    assert launch_main([str(p), "--device", "cpu", "--dry-run"]) == 0
    dry = capsys.readouterr().out.strip()
    assert exported.replace("--device cuda", "--device cpu") == dry


def test_a_cpu_plan_exports_a_cpu_launch(tmp_path, capsys):
    """A plan made for --gpu cpu is launched on the CPU: its torchrun command and Slurm script say --device cpu."""
    from dataclasses import replace

    plan = make_plan(tiny_model("gpt"), gb=8, tp=2, dp=1, micro_batch=1, sharding="none", cuda_graph=False)
    p = write(tmp_path, replace(plan, cluster={**plan.cluster, "gpu": "cpu"}))
    prof = json.loads((REPO / "profiles" / "h200-sxm.json").read_text())
    (tmp_path / "cpu.json").write_text(json.dumps({**prof, "gpu": "cpu"}))  # as `plan profile --device cpu` labels it
    mine = ["--profile", str(tmp_path / "cpu.json")]
    assert cli_main(["export", str(p), "--to", "torchrun", *mine]) == 0
    out = capsys.readouterr().out
    assert "--device cpu" in out and "--device cuda" not in out
    assert cli_main(["export", str(p), "--to", "slurm", *mine]) == 0
    assert "--device cpu" in capsys.readouterr().out


def test_slurm_script(tmp_path, capsys):
    p = write(tmp_path, make_plan(CATALOGUE["gpt-1.3b"], gb=64, tp=2, pp=2, dp=8, micro_batch=1))
    assert cli_main(["export", str(p), "--to", "slurm", "--partition", "gpu"]) == 0
    out = capsys.readouterr().out
    assert "#SBATCH --nodes=4" in out and "#SBATCH --gpus-per-node=8" in out and "#SBATCH --partition=gpu" in out
    assert "--nnodes 4" in out and "--nproc-per-node 8" in out and "plan launch" in out
    assert '--node-rank "$SLURM_NODEID"' in out and "scontrol show hostnames" in out
    assert subprocess.run(["bash", "-n"], input=out, text=True).returncode == 0
    assert cli_main(["export", str(p), "--to", "slurm", "--nodes", "2"]) == 0
    out = capsys.readouterr().out
    assert "#SBATCH --nodes=2" in out and "#SBATCH --gpus-per-node=16" in out
    assert cli_main(["export", str(p), "--to", "slurm", "--nodes", "3"]) == 1
    err = capsys.readouterr().err.strip()
    assert "do not split evenly over 3 nodes" in err and "\n" not in err
    assert cli_main(["export", str(p), "--to", "slurm", "--nodes", "32"]) == 1  # 1 GPU a node under TP 2
    err = capsys.readouterr().err.strip()
    assert "would split each TP group of 2 across nodes" in err and "--gpus-per-node 1" in err and "\n" not in err


def test_optimizer_options_export_to_megatron_torchrun_and_slurm(tmp_path, capsys):
    """The learning-rate schedule and AdamW settings `plan launch` trains with: as Megatron-LM's arguments (its own
    defaults differ), and carried by the torchrun and Slurm exports exactly as `plan launch` takes them."""
    p = write(tmp_path, make_plan(CATALOGUE["gpt-1.3b"], gb=64, tp=2, pp=2, dp=2, micro_batch=1))
    v = megatron_args(make_plan(CATALOGUE["gpt-1.3b"], gb=64, tp=2, dp=2, micro_batch=1)).value
    assert (v("--lr"), v("--min-lr"), v("--lr-warmup-iters"), v("--lr-decay-style")) == ("0.0003", "0.0", "10", "constant")
    assert v("--lr-decay-iters") is None
    assert (v("--weight-decay"), v("--clip-grad"), v("--adam-beta1"), v("--adam-beta2"), v("--adam-eps")) == \
        ("0.1", "1.0", "0.9", "0.95", "1e-08")
    opts = ["--lr", "6e-4", "--min-lr", "6e-5", "--lr-decay-style", "cosine", "--lr-decay-steps", "5000",
            "--weight-decay", "0.05"]
    assert cli_main(["export", str(p), "--to", "megatron", *opts]) == 0
    out = capsys.readouterr().out
    for line in ("--lr 0.0006", "--min-lr 6e-05", "--lr-decay-style cosine", "--lr-decay-iters 5000",
                 "--weight-decay 0.05"):
        assert f"    {line}\n" in out
    assert cli_main(["export", str(p), "--to", "torchrun", *opts]) == 0
    exported = capsys.readouterr().out.splitlines()[-1]
    assert "--lr 0.0006 --min-lr 6e-05 --lr-decay-style cosine --lr-decay-steps 5000 --weight-decay 0.05" in exported
    assert cli_main(["export", str(p), "--to", "slurm", *opts]) == 0
    assert "--lr-decay-steps 5000" in capsys.readouterr().out
    assert cli_main(["export", str(p), "--to", "megatron", "--lr-decay-style", "wsd", "--lr-decay-steps", "5000",
                     "--lr-wsd-decay-steps", "1000", "--lr-wsd-decay-style", "cosine"]) == 0
    out = capsys.readouterr().out
    for line in ("--lr-decay-style WSD", "--lr-decay-iters 5000", "--lr-wsd-decay-iters 1000",
                 "--lr-wsd-decay-style cosine"):
        assert f"    {line}\n" in out
    assert cli_main(["export", str(p), "--to", "megatron", "--lr-decay-style", "cosine"]) == 1
    err = capsys.readouterr().err.strip()
    assert "needs --lr-decay-steps" in err and "\n" not in err


@pytest.mark.parametrize("content,expect", [
    (None, "does not exist"),
    ("{not json", "not readable JSON"),
    ('{"format": "something-else"}', "not a parallel-plan plan"),
])
def test_bad_plan_file_is_one_sentence(tmp_path, capsys, content, expect):
    p = tmp_path / "bad.json"
    if content is not None:
        p.write_text(content)
    assert cli_main(["export", str(p), "--to", "megatron"]) == 1
    cap = capsys.readouterr()
    err = cap.err.strip()
    assert expect in err and "\n" not in err and "Traceback" not in err and cap.out == ""


def test_output_file_refuses_overwrite(tmp_path, capsys):
    p = write(tmp_path, make_plan(tiny_model("gpt"), gb=8, tp=2, dp=1, micro_batch=1, sharding="none"))
    o = tmp_path / "args.sh"
    assert cli_main(["export", str(p), "--to", "megatron", "-o", str(o)]) == 0
    assert "MEGATRON_ARGS" in o.read_text()
    assert cli_main(["export", str(p), "--to", "megatron", "-o", str(o)]) == 1
    assert "already exists" in capsys.readouterr().err
    assert cli_main(["export", str(p), "--to", "megatron", "-o", str(o), "--force"]) == 0


def test_export_does_not_import_torch(tmp_path):
    p = write(tmp_path, make_plan(tiny_model("gpt"), gb=8, tp=2, dp=2, micro_batch=1))
    code = ("import sys; from planner.cli import main; "
            f"[main(['export', {str(p)!r}, '--to', t]) for t in ('megatron', 'torchrun', 'slurm')]; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_fp8_plan_exports_the_hybrid_tensorwise_recipe():
    m = CATALOGUE["gpt-1.3b"]
    plan = make_plan(m, even_stages(24, 1, "none"), gb=64, tp=2, dp=4, micro_batch=4, fp8=True)
    ex = megatron_args(plan)
    assert ex.value("--fp8-format") == "hybrid" and ex.value("--fp8-recipe") == "tensorwise"
    assert any("Transformer Engine" in n for n in ex.notes)
    plain = make_plan(m, even_stages(24, 1, "none"), gb=64, tp=2, dp=4, micro_batch=4)
    assert megatron_args(plain).value("--fp8-format") is None


def test_attention_biases_export_qkv_bias_and_note_the_output_bias():
    """Qwen2-style q/k/v biases are Megatron's --add-qkv-bias beside --disable-bias-linear; the output
    projection's bias (Llama attention_bias) has no flag of its own and is named in the notes. GPT: neither."""
    from dataclasses import replace
    base = CATALOGUE["llama3-8b"]
    for spec, qkv_flag, noted in [(base, None, False), (replace(base, qkv_bias=True), True, False),
                                  (replace(base, qkv_bias=True, attn_out_bias=True), True, True),
                                  (CATALOGUE["gpt-1.3b"], None, False)]:
        ex = megatron_args(make_plan(spec, gb=512, tp=2, micro_batch=1))
        assert ex.value("--add-qkv-bias") is qkv_flag, spec
        assert ex.value("--disable-bias-linear") is (None if spec.has_bias else True)
        assert any("output projection has a bias" in n and f"{32 * 4096:,}" in n for n in ex.notes) is noted


def test_rotary_base_norm_epsilon_and_llama31_rope_scaling():
    """--rotary-base for rotary models (an int in Megatron-LM), --norm-epsilon always; Llama 3.1's scaling as
    --use-rope-scaling --rope-scaling-factor, with no note where it is Megatron's fixed llama3 recipe and one naming
    what differs where it is not; a config's scaling the plan left out is noted."""
    from dataclasses import replace
    v = megatron_args(make_plan(CATALOGUE["llama3-70b"], gb=512, tp=8, micro_batch=1)).value
    assert (v("--rotary-base"), v("--norm-epsilon")) == ("500000", "1e-05")
    assert v("--use-rope-scaling") is None and v("--rope-scaling-factor") is None
    ex = megatron_args(make_plan(CATALOGUE["llama3-405b"], gb=2048, tp=8, micro_batch=1))
    assert (ex.value("--rotary-base"), ex.value("--use-rope-scaling"), ex.value("--rope-scaling-factor")) == \
        ("500000", True, "8.0")
    assert not any("rope" in n.lower() or "rotary" in n for n in ex.notes)
    assert megatron_args(make_plan(CATALOGUE["mixtral-8x7b"], gb=1024, ep=8, dp=8, micro_batch=1)).value(
        "--rotary-base") == "1000000"
    gpt = megatron_args(make_plan(CATALOGUE["gpt-1.3b"], gb=64, micro_batch=1, sharding="none")).value
    assert gpt("--rotary-base") is None and gpt("--norm-epsilon") == "1e-05"
    assert megatron_args(make_plan(CATALOGUE["bert-base"], gb=256, micro_batch=4, sharding="none")).value(
        "--norm-epsilon") == "1e-12"
    qwen = replace(CATALOGUE["llama3-8b"], rope_theta=1e6, norm_eps=1e-6)
    assert megatron_args(make_plan(qwen, gb=512, tp=2, micro_batch=1)).value("--norm-epsilon") == "1e-06"
    # Llama 3.2-1B's factor 32: Megatron's pretrain_gpt.py scales by 8 whatever --rope-scaling-factor says
    llama32 = replace(CATALOGUE["llama3-8b"], rope_scaling_factor=32.0, rope_low_freq_factor=1.0,
                      rope_high_freq_factor=4.0, rope_original_max_positions=8192, rope_theta=500000.5)
    ex = megatron_args(make_plan(llama32, gb=512, tp=2, micro_batch=1))
    assert ex.value("--rope-scaling-factor") == "32.0" and ex.value("--rotary-base") == "500000"
    assert any("scales with factor 8 whatever is given" in n and "the plan's model has factor 32" in n for n in ex.notes)
    assert any("rotary base is 500000.5" in n and "given as 500000" in n for n in ex.notes)
    yarn = replace(CATALOGUE["llama3-8b"], unapplied_rope_scaling="yarn")
    notes = megatron_args(make_plan(yarn, gb=512, tp=2, micro_batch=1)).notes
    assert any("rope_scaling of type 'yarn'" in n and "leaves out" in n for n in notes)


def test_qk_norm_exports_qk_layernorm():
    """Qwen3's per-head q/k RMSNorm is Megatron-Core's --qk-layernorm (the --normalization norm over each head of q and
    k at --norm-epsilon, before rotary); with Qwen3's head_dim 128 beside a hidden 2048 / 32 heads also --kv-channels.
    Models without the norms do not get the flag."""
    from dataclasses import replace
    base = CATALOGUE["llama3-8b"]
    qwen3 = replace(base, hidden=2048, num_heads=32, num_kv_heads=4, head_dim_override=128, qk_norm=True,
                    norm_eps=1e-6)
    ex = megatron_args(make_plan(qwen3, gb=512, tp=2, micro_batch=1))
    assert ex.value("--qk-layernorm") is True
    assert ex.value("--normalization") == "RMSNorm"
    assert (ex.value("--norm-epsilon"), ex.value("--kv-channels")) == ("1e-06", "128")
    assert not any("q/k" in n or "qk" in n for n in ex.notes)
    for spec in (base, CATALOGUE["gpt-1.3b"]):
        assert megatron_args(make_plan(spec, gb=512, tp=2, micro_batch=1)).value("--qk-layernorm") is None


def test_gemma_is_not_exported_to_megatron():
    """Megatron-LM has no GeGLU MLP, (1 + weight) norm or scaled embedding: a Gemma plan is refused in one sentence
    rather than exported as --swiglu (another model)."""
    from planner.errors import PlanError
    with pytest.raises(PlanError, match="no GeGLU MLP.*family 'gemma'") as exc:
        megatron_args(make_plan(tiny_model("gemma"), gb=8, micro_batch=1, sharding="none"))
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize("to", ["megatron", "torchrun", "slurm"])
def test_approximated_model_type_is_not_exported(tmp_path, capsys, to):
    """A plan of a model type read as a GPT-style approximation (falcon: rotary positions and a parallel residual
    there, learned positions and a sequential residual here) is refused by every export, as `plan launch` refuses
    it: torchrun and Slurm would run a command that stops at launch, and Megatron-LM's arguments would train
    another model."""
    from dataclasses import replace
    spec = replace(tiny_model("gpt"), hf_model_type="falcon")
    p = write(tmp_path, make_plan(spec, gb=8, tp=2, dp=1, micro_batch=1, sharding="none"))
    assert cli_main(["export", str(p), "--to", to]) == 1
    cap = capsys.readouterr()
    err = cap.err.strip()
    assert "model_type 'falcon'" in err and "approximated" in err and "\n" not in err and cap.out == ""
