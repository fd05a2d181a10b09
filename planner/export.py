"""`plan export plan.json --to megatron|torchrun|slurm`: a plan in the form another launcher takes.

- megatron: the Megatron-LM `pretrain_gpt.py` arguments that realise the plan (parallel sizes, the layer
  split, micro/global batch, sequence parallel, distributed optimizer, overlap flags, recompute, model
  shape), as a bash array with a comment block naming what Megatron cannot express.
- torchrun: the exact command `plan launch` runs (built by planner.launch_command, which `plan launch` uses too).
- slurm: an sbatch script running the plan on N nodes: srun starts one `plan launch` per node, torchrun
  underneath, rendezvous on the first node.

Megatron-LM argument names were checked against the NVIDIA/Megatron-LM source that megatron_source() names:
megatron/training/arguments.py (hand-written arguments, e.g. --num-layers-per-virtual-pipeline-stage,
--decoder-first-pipeline-num-layers, --pipeline-model-parallel-layout, --use-distributed-optimizer,
--overlap-grad-reduce, --swiglu, --group-query-attention) and the dataclasses it turns into arguments
through ArgumentGroupFactory (field `foo_bar` -> `--foo-bar`): megatron/core/model_parallel_config.py
(--tensor-model-parallel-size, --sequence-parallel, --context-parallel-size, --expert-model-parallel-size,
--tp-comm-overlap, --bf16), megatron/core/transformer/transformer_config.py (--num-layers, --hidden-size,
--num-query-groups, --normalization, --disable-bias-linear, --add-qkv-bias, --recompute-granularity/-method/-num-layers,
--recompute-modules, --moe-router-topk, --norm-epsilon: field layernorm_epsilon's own argparse name, --qk-layernorm:
field qk_layernorm, a store_true flag; megatron/core/transformer/attention.py applies `normalization` with
layernorm_epsilon over each head of q and k (hidden_size_per_attention_head) before rotary, as Qwen3; its
examples/post_training/modelopt/conf/Qwen/Qwen3-*.sh pass it),
megatron/training/config/training_config.py (--micro-batch-size, --global-batch-size),
megatron/core/transformer/pipeline_parallel_layer_layout.py (layout syntax). The rotary arguments (--rotary-base,
an int there; --use-rope-scaling, --rope-scaling-factor) are hand-written in arguments.py; what the llama3 scaling
applies is in megatron/core/models/common/embeddings/rotary_pos_embedding.py and gpt_builders.py (MEGATRON_ROPE_SCALING).
--virtual-pipeline-model-parallel-size is not a command-line argument there (excluded from the
factory); --num-layers-per-virtual-pipeline-stage or the layout string set it.
"""
from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from planner.errors import PlanError
from planner.lr_schedule import ADAM_BETAS, ADAM_EPS, LrSchedule, OptimizerSettings
from planner.lr_schedule import add_options as add_optimizer_options
from planner.lr_schedule import from_args as optimizer_settings
from planner.lr_schedule import to_argv as optimizer_argv
from planner.export_prediction import runtime_predictions
from planner.plan import Plan
from planner.shell_safe import check_slurm_time, check_slurm_value, safe_model_name

MEGATRON_SOURCE_FILE = "megatron-export-source.json"
"""In profiles/targets/: the Megatron-LM source (repository, files, commit, date) the argument names were checked
against; data, so that a re-check changes a file, not the code."""


def megatron_source() -> str:
    """The Megatron-LM source the exported argument names were checked against, as the export's header names it."""
    from planner.cost.targets import target_file
    from planner.errors import read_json

    p = target_file(MEGATRON_SOURCE_FILE.removesuffix(".json"))
    d = read_json(p, "Megatron-LM source file", f"the Megatron-LM source file is missing ({p})")
    return f"{d['repository']} {d['files']} at commit {d['commit']}, {d['date']}"


def build_parser() -> argparse.ArgumentParser:
    """`plan export`'s arguments."""
    from planner.arguments import Parser, add_runtime_arg, positive_int
    from planner.launch_command import add_launch_flags
    from planner.limits import MAX_GPUS, MAX_GPUS_PER_NODE

    ap = Parser(prog="plan export", description="Write a plan as Megatron-LM arguments, the torchrun command of "
                "`plan launch`, or a Slurm batch script.")
    ap.add_argument("plan", help="plan.json written by `plan -o`")
    ap.add_argument("--to", required=True, choices=["megatron", "torchrun", "slurm"])
    add_runtime_arg(ap)
    ap.add_argument("--profile", help="profile JSON for the predictions (default: the one shipped for the plan's GPU)")
    ap.add_argument("-o", "--output", help="write here instead of standard output")
    ap.add_argument("--force", action="store_true", help="overwrite the -o file if it exists")
    ap.add_argument("--nodes", type=positive_int("--nodes", MAX_GPUS),
                    help="nodes to run on (default: world size / the plan's GPUs per node)")
    ap.add_argument("--gpus-per-node", type=positive_int("--gpus-per-node", MAX_GPUS_PER_NODE),
                    help="default: the plan's cluster (8 when it does not say)")
    # `plan launch`'s own flags, forwarded to it (torchrun, slurm)
    add_launch_flags(ap, ("--node-rank", "--rdzv-endpoint", "--steps", "--data", "--results"), help={
        "--node-rank": "torchrun: this node's rank (several nodes)",
        "--rdzv-endpoint": "torchrun: host:port of the rendezvous (several nodes)",
        "--steps": "training steps (torchrun, slurm)",
        "--data": "data source passed to `plan launch` (torchrun, slurm)",
        "--results": "per-step results CSV (torchrun, slurm; default: beside the plan)"})
    ap.add_argument("--time", default="01:00:00", help="slurm: wall-clock limit (default 01:00:00)")
    ap.add_argument("--partition", help="slurm: partition")
    ap.add_argument("--account", help="slurm: account")
    ap.add_argument("--job-name", help="slurm: job name (default plan-<model>)")
    add_optimizer_options(ap)  # `plan launch`'s (torchrun, slurm) and their Megatron-LM equivalents (megatron)
    return ap


# -- Megatron-LM ----------------------------------------------------------------------------------------

@dataclass
class MegatronExport:
    """A plan as Megatron-LM arguments: what megatron_args returns and render_megatron writes."""
    args: list[str]
    """Flat argument list, as pretrain_gpt.py takes it."""
    notes: list[str] = field(default_factory=list)
    """What Megatron cannot express, or expresses only approximately."""
    script: str = "pretrain_gpt.py"

    def groups(self) -> list[list[str]]:
        """The arguments as [flag, values...] groups (one per line when rendered)."""
        out: list[list[str]] = []
        for a in self.args:
            if a.startswith("--"):
                out.append([a])
            else:
                out[-1].append(a)
        return out

    def value(self, flag: str):
        """The value(s) of a flag: None if absent, True for a bare switch, a str or a list of str."""
        for g in self.groups():
            if g[0] == flag:
                return True if len(g) == 1 else (g[1] if len(g) == 2 else g[1:])
        return None


def _optimizer(settings: OptimizerSettings, add, notes: list[str]) -> None:
    """AdamW and the learning-rate schedule as `plan launch` trains them (Megatron-LM's own defaults differ: weight
    decay 0.01, beta2 0.999)."""
    s = settings.schedule
    add("--lr", s.peak_lr)
    add("--min-lr", s.min_lr)
    add("--lr-warmup-iters", s.warmup_steps)
    add("--lr-decay-style", "WSD" if s.decay_style == "wsd" else s.decay_style)
    if s.decay_steps is not None:
        add("--lr-decay-iters", s.decay_steps)
    if s.decay_style == "wsd":
        add("--lr-wsd-decay-iters", s.wsd_decay_steps)
        add("--lr-wsd-decay-style", s.wsd_decay_style)
    add("--weight-decay", settings.weight_decay)
    add("--clip-grad", settings.clip_grad)
    add("--adam-beta1", ADAM_BETAS[0])
    add("--adam-beta2", ADAM_BETAS[1])
    add("--adam-eps", ADAM_EPS)
    if s.warmup_steps:
        notes.append(f"the learning-rate warm-up's first step trains at --lr / {s.warmup_steps} in `plan launch`, at 0 "
                     "in Megatron-LM (its warm-up starts one step earlier)")


def _layout_string(layers: list[int]) -> str:
    """Megatron's --pipeline-model-parallel-layout: virtual stages in model order split by '|', 'E' the
    embedding on the first, 'L' the loss on the last, 't' a transformer layer ('t*3' = three)."""
    parts = []
    for j, n in enumerate(layers):
        s = ("E" if j == 0 else "") + (f"t*{n}" if n > 1 else "t" * n) + ("L" if j == len(layers) - 1 else "")
        parts.append(s)
    return "|".join(parts)


def megatron_args(plan: Plan, optimizer: OptimizerSettings | None = None) -> MegatronExport:
    """The plan as Megatron-LM arguments; `optimizer`: the learning-rate schedule and AdamW settings that `plan launch`
    would train with (default: its defaults).

    The flags come in a fixed order, one step each: parallel sizes and the layer split, MoE, batch, optimizer, data
    parallel sharding, communication overlap, recompute, model shape, precision; then the training script. Each
    step adds its flags through `add(flag, *values)` and appends to `notes` what Megatron-LM cannot express, or
    expresses only approximately.

    Returns:
        MegatronExport: the flat argument list, the notes and the script (pretrain_gpt.py or pretrain_bert.py).
    """
    m, lay, st = plan.model, plan.layout, plan.stages
    optimizer = optimizer or OptimizerSettings(LrSchedule())
    a: list[str] = []
    notes: list[str] = []

    def add(flag, *vals):
        a.append(flag)
        a.extend(str(v) for v in vals)

    _parallel_sizes(plan, add, notes)
    _moe(plan, add, notes)
    # -- batch
    add("--micro-batch-size", lay.micro_batch)
    add("--global-batch-size", plan.training.global_batch)
    _optimizer(optimizer, add, notes)
    _data_parallel(plan, add, notes)
    _overlap(plan, add, notes)
    _cuda_graph(plan, notes)
    _recompute(plan, add, notes)
    _model_shape(plan, add, notes)
    _precision(plan, add, notes)
    return _training_script(plan, a, notes)


def _parallel_sizes(plan: Plan, add, notes: list[str]) -> None:
    """TP (with sequence parallelism), PP and its layer split, and CP, as Megatron's parallel sizes."""
    lay = plan.layout
    add("--tensor-model-parallel-size", lay.tp)
    if lay.tp > 1:
        add("--sequence-parallel")
    add("--pipeline-model-parallel-size", lay.pp)
    if lay.pp > 1:
        _layer_split([s.layers for s in plan.stages], lay.pp, lay.vpp, add, notes)
    if lay.cp > 1:
        add("--context-parallel-size", lay.cp)
        add("--cp-comm-type", "p2p")


def _layer_split(layers: list[int], pp: int, vpp: int, add, notes: list[str]) -> None:
    """The layers per virtual pipeline stage (`layers`, in model order; `pp` ranks of `vpp` virtual stages each)
    in the simplest form Megatron takes:
    a uniform interleaved split as layers per virtual stage, uneven ends of a plain pipeline as the first and
    last stage's counts, and any other split as --pipeline-model-parallel-layout."""
    uniform = len(set(layers)) == 1
    if uniform and vpp > 1:
        add("--num-layers-per-virtual-pipeline-stage", layers[0])
    elif not uniform and vpp == 1 and pp == 2:
        add("--decoder-first-pipeline-num-layers", layers[0])
    elif not uniform and vpp == 1 and len(set(layers[1:-1])) == 1:
        mid = layers[1]
        if layers[0] != mid:
            add("--decoder-first-pipeline-num-layers", layers[0])
        if layers[-1] != mid:
            add("--decoder-last-pipeline-num-layers", layers[-1])
    elif not uniform:
        add("--pipeline-model-parallel-layout", _layout_string(layers))
        notes.append("the non-uniform split (" + " ".join(map(str, layers)) + " layers per virtual stage) is "
                     "given as --pipeline-model-parallel-layout, which current Megatron-LM accepts; older "
                     "Megatron can only set the ends (--decoder-first-pipeline-num-layers / "
                     "--decoder-last-pipeline-num-layers) and would lose this split")


def _moe(plan: Plan, add, notes: list[str]) -> None:
    """An MoE model's experts, router and expert parallelism (nothing for a dense model)."""
    m, lay = plan.model, plan.layout
    if not m.is_moe:
        return
    add("--num-experts", m.num_experts)
    add("--moe-router-topk", m.top_k)
    add("--expert-model-parallel-size", lay.ep)
    add("--moe-token-dispatcher-type", "alltoall")
    add("--moe-aux-loss-coeff", m.moe_aux_loss_coeff)
    if m.shared_expert_ffn:
        add("--moe-shared-expert-intermediate-size", m.shared_expert_ffn)
        if m.shared_expert_gate:
            notes.append("the shared experts' output is gated per token (Qwen); Megatron-Core releases that "
                         "support it take --moe-shared-expert-gate, older ones run them ungated")
    if m.moe_capacity_factor:
        add("--moe-expert-capacity-factor", m.moe_capacity_factor)
    if not m.moe_normalize_topk:  # softmax over all experts, then top-k, not renormalised (Qwen MoE)
        add("--moe-router-pre-softmax")
    if lay.tp > 1:
        add("--expert-tensor-parallel-size", 1)  # the planner keeps experts whole on each TP rank


def _data_parallel(plan: Plan, add, notes: list[str]) -> None:
    """Data-parallel sharding (ZeRO-1 as the distributed optimizer, ZeRO-2/3 as Megatron-FSDP), the main
    gradients' dtype, and the overlap of the gradient reduction (and parameter gather) with compute."""
    lay = plan.layout
    sharded = lay.sharding != "none"
    if lay.sharding == "optimizer":
        add("--use-distributed-optimizer")
    elif lay.sharding in ("optimizer+grads", "full"):
        strategy = "optim_grads" if lay.sharding == "optimizer+grads" else "optim_grads_params"
        add("--use-megatron-fsdp")
        add("--data-parallel-sharding-strategy", strategy)
        notes.append(f"sharding '{lay.sharding}' (ZeRO-{2 if strategy == 'optim_grads' else 3}) has no stock-DDP "
                     f"form in Megatron-LM; it is given as Megatron-FSDP (--use-megatron-fsdp "
                     f"--data-parallel-sharding-strategy {strategy}), which has its own constraints (checkpoint "
                     "format, Transformer Engine); --use-distributed-optimizer alone would be ZeRO-1 and need "
                     "more memory than planned")
    if lay.grad_dtype == "fp32":
        # main gradients and their reduction in fp32 (Megatron's default with --bf16 is the params' bf16)
        add("--accumulate-allreduce-grads-in-fp32")
    if lay.overlap_dp and lay.dp * lay.cp > 1:
        add("--overlap-grad-reduce")
        if sharded:
            add("--overlap-param-gather")


def _overlap(plan: Plan, add, notes: list[str]) -> None:
    """The overlap of TP, PP and EP communication with compute, where the plan overlaps it and Megatron can."""
    lay = plan.layout
    if lay.overlap_tp and lay.tp > 1:
        add("--tp-comm-overlap")
        notes.append("--tp-comm-overlap needs Transformer Engine with userbuffers (--transformer-impl "
                     "transformer_engine); drop it on the local layer implementation")
    if not lay.overlap_pp and lay.pp > 1:
        add("--no-overlap-p2p-communication")
    if lay.overlap_ep and lay.ep > 1:
        # Megatron-Core's batch-level EP overlap (v0.14+): one micro-batch's all-to-alls beside another's layer. Its
        # TransformerConfig wants no pipeline or an interleaved one, and no full recompute
        if (lay.pp == 1 or lay.vpp > 1) and not any(s.full_recompute_layers for s in plan.stages):
            add("--overlap-moe-expert-parallel-comm")
            add("--delay-wgrad-compute")
            notes.append("the plan overlaps the MoE all-to-alls (ours: two chunks per dispatch); Megatron-Core 0.14 "
                         "and later run them beside another micro-batch's layer with these two flags")
        else:
            notes.append("the plan dispatches MoE tokens in two chunks whose all-to-alls overlap the other chunk's "
                         "experts (this runtime's); Megatron's --overlap-moe-expert-parallel-comm needs no pipeline "
                         "or an interleaved one and no full recompute, so it is not exported")


def _cuda_graph(plan: Plan, notes: list[str]) -> None:
    """A note for a plan that replays its step as one CUDA graph. It is not exported as a flag: Megatron's CUDA
    graphs capture per layer through Transformer Engine, not the whole step, and their flags differ between
    releases."""
    if plan.layout.cuda_graph:
        notes.append("the plan replays the whole step as one CUDA graph and its prediction counts no host time; "
                     "Megatron-LM runs it eagerly unless its own CUDA-graph options (Transformer Engine) are set, "
                     "and for small layers or TP > 1 the host may then pace the step")


def _query_groups(plan: Plan, add, notes: list[str]) -> None:
    """Grouped-query attention. Megatron-Core's TransformerConfig accepts query groups that are a multiple or a
    divisor of TP; with fewer groups than TP ranks its attention (num_query_groups < world_size) gives each rank
    one KV group, shared with the ranks of its query heads. Any other count is refused here by name."""
    kv, tp = plan.model.num_kv_heads, plan.layout.tp
    if kv % tp and tp % kv:
        raise PlanError(f"Megatron-LM needs the {kv} query groups (KV heads) to be a multiple or a divisor of "
                        f"TP {tp}")
    add("--group-query-attention")
    add("--num-query-groups", kv)
    if kv < tp:
        notes.append(f"{kv} query group(s) under TP {tp}: each KV head is shared by {tp // kv} TP ranks, which "
                     "needs a Megatron-Core whose attention handles num_query_groups < TP (older releases refuse "
                     "query groups that are not a multiple of TP)")


def _model_shape(plan: Plan, add, notes: list[str]) -> None:
    """The model's architecture: layers, widths, heads, sequence, MLP, norms, positions, embeddings, biases and
    (no) dropout."""
    m = plan.model
    add("--num-layers", m.num_layers)
    add("--hidden-size", m.hidden)
    add("--ffn-hidden-size", m.ffn_hidden)
    add("--num-attention-heads", m.num_heads)
    if m.num_kv_heads != m.num_heads:
        _query_groups(plan, add, notes)
    if m.head_dim_override:
        add("--kv-channels", m.head_dim)
    add("--seq-length", plan.training.seq_len)
    add("--max-position-embeddings", m.max_seq_len)
    if m.gated_mlp:
        add("--swiglu")
    add("--normalization", "LayerNorm" if m.layernorm else "RMSNorm")
    add("--position-embedding-type", "learned_absolute" if m.learned_positions else "rope")
    if not m.learned_positions:
        _rotary(m, add, notes)
    add("--norm-epsilon", m.norm_eps)
    if m.qk_norm:  # per head, RMSNorm (--normalization) at --norm-epsilon, before rotary: Qwen3's q/k norms
        add("--qk-layernorm")
    if not m.tie_embeddings:
        add("--untie-embeddings-and-output-weights")
    if not m.has_bias:
        add("--disable-bias-linear")
        if m.qkv_bias:  # Megatron-Core's linear_qkv takes a bias under add_bias_linear or add_qkv_bias
            add("--add-qkv-bias")
        if m.attn_out_bias:
            notes.append("the attention's output projection has a bias (Hugging Face attention_bias); Megatron-LM "
                         "gives it one only with biases on every linear layer (no --disable-bias-linear), which would "
                         "add the MLP's biases too, so the export leaves it out: the exported model lacks "
                         f"{m.num_layers * m.hidden:,} of the plan's parameters")
    add("--attention-dropout", "0.0")
    add("--hidden-dropout", "0.0")


def _precision(plan: Plan, add, notes: list[str]) -> None:
    """bf16 weights and activations, and FP8 GEMMs where the plan runs them."""
    add("--bf16")
    if plan.layout.fp8:
        # E4M3 forward, E5M2 gradients, per-tensor scaling from the current amax: the runtime's recipe
        add("--fp8-format", "hybrid")
        add("--fp8-recipe", "tensorwise")
        notes.append("FP8 in Megatron-LM runs through Transformer Engine, which must be installed; its FP8 also "
                     "covers the weight-gradient GEMMs, which this runtime keeps in bf16")


def _training_script(plan: Plan, a: list[str], notes: list[str]) -> MegatronExport:
    """The export of the arguments `a` and `notes`, with the training script that takes them (pretrain_bert.py for
    BERT, pretrain_gpt.py for the rest) and the note on how the vocabulary is padded."""
    m = plan.model
    script = "pretrain_gpt.py"
    if m.model_family.masked_lm:
        script = "pretrain_bert.py"
        notes.append("BERT trains with pretrain_bert.py, whose model adds a binary (next-sentence) head unless "
                     "--bert-no-binary-head is given; the plan has none")
    notes.append(f"vocabulary: {m.vocab_size} token ids, which this runtime pads to {m.padded_vocab} rows (a multiple of 128); "
                 f"Megatron-LM pads to a multiple of 128 x TP (for synthetic data: --tokenizer-type NullTokenizer "
                 f"--vocab-size {m.vocab_size} --make-vocab-size-divisible-by 128)")
    return MegatronExport(a, notes, script)


MEGATRON_ROPE_SCALING = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192}
"""What Megatron-Core's llama3 rope scaling (RotaryEmbedding._apply_scaling, in the source megatron_source() names) applies:
only the factor is an argument, and pretrain_gpt.py's model builder (gpt_builders.py) does not pass even that on,
so --rope-scaling-factor is left at RotaryEmbedding's default 8; the other three are fixed."""


def _rotary(m, add, notes: list[str]) -> None:
    """The rotary base and Llama 3.1 frequency scaling of a rotary model, or a note where Megatron cannot say them."""
    base = round(m.rope_theta)
    add("--rotary-base", base)
    if base != m.rope_theta:
        notes.append(f"the rotary base is {m.rope_theta}; Megatron-LM's --rotary-base takes a whole number, so it "
                     f"is given as {base}")
    if m.rope_scaling_factor:
        add("--use-rope-scaling")
        add("--rope-scaling-factor", m.rope_scaling_factor)
        ours = {"factor": m.rope_scaling_factor, "low_freq_factor": m.rope_low_freq_factor,
                "high_freq_factor": m.rope_high_freq_factor,
                "original_max_position_embeddings": m.rope_original_max_positions}
        differ = {k: v for k, v in ours.items() if v != MEGATRON_ROPE_SCALING[k]}
        if differ:
            notes.append("Llama 3.1 rope scaling: Megatron-LM's pretrain_gpt.py scales with "
                         + ", ".join(f"{k} {MEGATRON_ROPE_SCALING[k]:g}" for k in differ) + " whatever is given "
                         "(only --rope-scaling-factor is an argument, and its model builder does not pass it on); the "
                         "plan's model has " + ", ".join(f"{k} {v:g}" for k, v in differ.items()))
    if m.unapplied_rope_scaling:
        notes.append(f"the model's source config asks for rope_scaling of type '{m.unapplied_rope_scaling}', which "
                     "the plan leaves out (its runtime trains with plain rotary), and so does this export; Megatron-LM "
                     "has its own options for some types (e.g. --position-embedding-type yarn)")


def _recompute(plan: Plan, add, notes: list[str]) -> None:
    """The plan's per-stage recompute in Megatron's terms: one granularity for the whole run, and for full
    recompute either every layer (uniform, 1 layer per unit) or the first N layers of every model chunk
    (block). Where the plan differs per stage, the export recomputes at least as much as planned (memory
    stays within the plan; the step is slower than predicted) and says so."""
    st = plan.stages
    full = [s.full_recompute_layers for s in st]
    sel = [s.selective_recompute_layers for s in st]
    if not any(full) and not any(sel):
        return
    if any(full):
        if all(f == s.layers for f, s in zip(full, st)):
            add("--recompute-granularity", "full")
            add("--recompute-method", "uniform")
            add("--recompute-num-layers", 1)
            return
        n = max(f + s for f, s in zip(full, sel))
        add("--recompute-granularity", "full")
        add("--recompute-method", "block")
        add("--recompute-num-layers", n)
        per = ", ".join(f"{s.full_recompute_layers}/{s.layers}" for s in st)
        if len(set(full)) > 1 or any(sel):
            notes.append(f"per-stage recompute differs in the plan (full layers per virtual stage: {per}"
                         + (f"; plus {sum(sel)} selective layers" if any(sel) else "") +
                         f"); Megatron takes one count for every model chunk, so the export recomputes fully the "
                         f"first {n} layers of each chunk: memory stays within the plan, the step is slower than predicted")
        return
    add("--recompute-granularity", "selective")
    mods = ["core_attn", "layernorm"] + (["moe_act"] if plan.model.is_moe else [])
    add("--recompute-modules", *mods)
    if not all(s == x.layers for s, x in zip(sel, st)):
        notes.append(f"the plan recomputes selectively only {sum(sel)} of {plan.model.num_layers} layers; "
                     "Megatron's selective recompute applies to every layer (less memory, a slightly slower step)")
    if not plan.model.is_moe:
        notes.append("selective recompute: Megatron recomputes the attention core and the norms "
                     "(--recompute-modules core_attn layernorm); the plan also recomputes the MLP activation, "
                     "which Megatron offers only for MoE experts (moe_act), so memory is somewhat above the plan's")


def render_megatron(plan: Plan, plan_path: str, optimizer: OptimizerSettings | None = None,
                    predictions: list[str] | None = None) -> str:
    """The bash script of a plan's Megatron-LM arguments: a comment block (what it realises, the predictions, what
    Megatron cannot express) and the MEGATRON_ARGS array, one flag per line."""
    ex = megatron_args(plan, optimizer)
    lay = plan.layout
    lines = [
        "#!/bin/bash",
        f"# Megatron-LM {ex.script} arguments realising {plan_path}: {plan.model.name}, {lay.short()}"
        + (f" x{lay.vpp} virtual stages" if lay.vpp > 1 else "") + f", world size {lay.world_size}",
        f"# (data parallel size {lay.dp} follows from the world size; launch {lay.world_size} processes)",
        f"# argument names checked against {megatron_source()}",
    ]
    for text in predictions or []:
        lines.append("# " + text)
    lines.append("#")
    lines.append("# Not expressible in Megatron-LM, or only approximately:")
    for n in ex.notes:
        lines.append("#   - " + n)
    lines.append("MEGATRON_ARGS=(")
    for g in ex.groups():
        lines.append("    " + " ".join(shlex.quote(x) for x in g))
    lines.append(")")
    lines.append(f"# torchrun --nproc-per-node <gpus per node> --nnodes <nodes> ... {ex.script} \"${{MEGATRON_ARGS[@]}}\" "
                 "<data, tokenizer and --train-iters arguments>")
    return _script(lines)


def _script(lines: list[str]) -> str:
    """The script's text: every comment line (not the #! and #SBATCH ones) cleared of line breaks and control
    characters, so that no text from a plan or a path can start a line of its own."""
    def safe(line: str) -> str:
        if line.startswith("#") and not line.startswith(("#!", "#SBATCH")):
            return "".join(c if c.isprintable() else " " for c in line)
        return line
    return "\n".join(safe(ln) for ln in lines) + "\n"


# -- torchrun / slurm -------------------------------------------------------------------------------------

def _gpus_per_node(plan: Plan, args) -> int:
    """--gpus-per-node, else the plan's cluster's, else 8."""
    return args.gpus_per_node or int(plan.cluster.get("gpus_per_node") or 8)


def _nodes(plan: Plan, args) -> int:
    """The nodes the plan runs on: --nodes (which must divide the world size), else the world size over the GPUs
    per node; a PlanError where the processes do not split evenly."""
    world = plan.layout.world_size
    if args.nodes:
        if world % args.nodes:
            raise PlanError(f"the plan's {world} processes ({plan.layout.short()}) do not split evenly over "
                            f"{args.nodes} nodes")
        return args.nodes
    g = min(_gpus_per_node(plan, args), world)
    if world % g:
        raise PlanError(f"the plan's {world} processes do not fill whole nodes of {g} GPUs; pass --nodes")
    return world // g


def launch_argv(plan_path: str, args, nodes: int, nproc: int, node_rank="0", rdzv=None) -> list[str]:
    """The `plan launch` arguments this export stands for."""
    out = [plan_path, "--steps", str(args.steps), "--data", args.data, "--nproc-per-node", str(nproc),
           "--nnodes", str(nodes)]
    if args.results:
        out += ["--results", args.results]
    out += optimizer_argv(optimizer_settings(args))
    if nodes > 1:
        out += ["--node-rank", str(node_rank), "--rdzv-endpoint", rdzv]
    return out


def torchrun_command(plan: Plan, plan_path: str, args) -> list[str]:
    """The command `plan launch` runs, from the builder `plan launch` itself uses (planner.launch_command)."""
    from planner import launch_command as launch

    nodes = _nodes(plan, args)
    nproc = plan.layout.world_size // nodes
    if nodes > 1 and not args.rdzv_endpoint:
        raise PlanError(f"the plan runs on {nodes} nodes; give --rdzv-endpoint host:port of the first node "
                        "(or export --to slurm, which finds it)")
    largs = launch.build_parser().parse_args(launch_argv(plan_path, args, nodes, nproc, args.node_rank,
                                                         args.rdzv_endpoint))
    results = Path(largs.results) if largs.results else Path(plan_path).with_suffix(".results.csv")
    return launch.torchrun_command(largs, nproc, results)


def render_torchrun(plan: Plan, plan_path: str, args) -> str:
    """The torchrun command of `plan launch` for this node, under a comment saying what it runs and where."""
    cmd = torchrun_command(plan, plan_path, args)
    nodes = _nodes(plan, args)
    head = f"# `plan launch` runs this for {plan_path} ({plan.layout.short()}, world size {plan.layout.world_size}, " \
           f"{nodes} node(s) x {plan.layout.world_size // nodes})"
    if nodes > 1:
        head += f"; run it on every node with its own --node-rank (this one: {args.node_rank})"
    return _script([head, " ".join(shlex.quote(c) for c in cmd)])


def render_slurm(plan: Plan, plan_path: str, args) -> str:
    """An sbatch script that runs the plan on its nodes: one `plan launch` task per node, each with its own
    --node-rank, the rendezvous on the first node. The Slurm values are checked to be safe in the script."""
    nodes = _nodes(plan, args)
    world = plan.layout.world_size
    nproc = world // nodes
    name = check_slurm_value("--job-name", args.job_name or f"plan-{safe_model_name(plan.model.name)}")
    check_slurm_time(args.time)
    if args.partition:
        check_slurm_value("--partition", args.partition, list_ok=True)
    if args.account:
        check_slurm_value("--account", args.account)
    plan_abs = str(Path(plan_path).resolve())
    # every node gets the same arguments but its own --node-rank, which srun's task expands for itself
    largv = launch_argv(plan_abs, args, nodes, nproc, "NODE_RANK", "RDZV")
    if nodes > 1:
        i = largv.index("--node-rank")
        del largv[i:i + 2]
        largv[largv.index("RDZV")] = "RDZV"
    quoted = ["${MASTER_ADDR}:${MASTER_PORT}" if x == "RDZV" else shlex.quote(x) for x in largv]
    quoted = ['"${MASTER_ADDR}:${MASTER_PORT}"' if x.startswith("${MASTER") else x for x in quoted]
    lines = [
        "#!/bin/bash",
        f"# Slurm batch script for {plan_path}: {plan.model.name}, {plan.layout.short()}, world size {world} "
        f"= {nodes} node(s) x {nproc} GPUs.",
        "# One task per node runs `plan launch` (torchrun underneath); the first node hosts the rendezvous.",
        f"#SBATCH --job-name={name}",
        f"#SBATCH --nodes={nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={nproc}",
        "#SBATCH --exclusive",
        f"#SBATCH --time={args.time}",
        "#SBATCH --output=%x-%j.out",
    ]
    if args.partition:
        lines.append(f"#SBATCH --partition={args.partition}")
    if args.account:
        lines.append(f"#SBATCH --account={args.account}")
    lines += [
        "set -euo pipefail",
        'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "export MASTER_PORT=${MASTER_PORT:-29500}",
        f'if [ "$SLURM_JOB_NUM_NODES" -ne {nodes} ]; then',
        f'    echo "this plan needs {nodes} node(s), the job has $SLURM_JOB_NUM_NODES" >&2; exit 1',
        "fi",
        "LAUNCH_ARGS=(" + " ".join(quoted) + ")",
        "# one task per node; each appends its own node rank ($SLURM_NODEID, expanded by the task, not here)",
        f"srun --kill-on-bad-exit=1 --ntasks={nodes} --ntasks-per-node=1 \\",
        "    bash -c 'exec plan launch \"$@\"" + (" --node-rank \"$SLURM_NODEID\"" if nodes > 1 else "")
        + "' plan-launch \"${LAUNCH_ARGS[@]}\"",
    ]
    return _script(lines)


def main(argv: list[str] | None = None) -> int:
    """`plan export`: write the plan in the asked form to -o or standard output, its predictions on standard
    error. Returns the exit status."""
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    plan = Plan.load(Path(args.plan))
    if args.output:
        from planner.outputs import check_output_file
        check_output_file(Path(args.output), "-o", overwrite=args.force)
    # Megatron's arguments come with the Megatron-target prediction (and the --runtime one beside it when it differs)
    runtimes = (["megatron"] + ([args.runtime] if args.runtime != "megatron" else [])) if args.to == "megatron" \
        else [args.runtime]
    predictions = runtime_predictions(plan, runtimes, args.profile)
    if args.to == "megatron":
        text = render_megatron(plan, args.plan, optimizer_settings(args), predictions)
    elif args.to == "torchrun":
        text = render_torchrun(plan, args.plan, args)
    else:
        text = render_slurm(plan, args.plan, args)
    for line in predictions:  # beside the file or the command, once it could be written
        print(line, file=sys.stderr)
    if args.output:
        from planner.outputs import write_file
        write_file(Path(args.output), text, mode=0o755)  # a new script is executable; an existing file keeps its mode
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    from planner.arguments import run_command
    sys.exit(run_command(main, sys.argv[1:]))
