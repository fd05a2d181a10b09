"""`plan export --to megatron`: a plan as Megatron-LM arguments, flag by flag (parallel sizes, the layer split,
MoE, data parallelism, overlap, model shape, precision, recompute), with a note wherever Megatron runs the plan
otherwise than this runtime; planner/export.py renders them and writes the other targets."""
from __future__ import annotations

from dataclasses import dataclass, field

from planner.errors import PlanError
from planner.lr_schedule import ADAM_BETAS, ADAM_EPS, LrSchedule, OptimizerSettings
from planner.plan import Plan


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
    lay = plan.layout
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
    """Grouped-query attention. Megatron-Core's TransformerConfig takes query groups that are a multiple or a divisor
    of TP and refuses the rest; fewer groups than TP ranks run by gathering the QKV output across TP
    (RuntimeTarget.qkv_output_gather), which Megatron-Core has since core_v0.16.0: the note says so."""
    kv, tp = plan.model.num_kv_heads, plan.layout.tp
    if kv % tp and tp % kv:
        raise PlanError(f"Megatron-LM needs the {kv} query groups (KV heads) to be a multiple or a divisor of TP {tp} "
                        f"(Megatron-Core's TransformerConfig refuses the rest); plan with a TP that {kv} divides or "
                        f"that divides {kv}")
    add("--group-query-attention")
    add("--num-query-groups", kv)
    if kv < tp:
        notes.append(f"{kv} query group(s) over TP {tp}: Megatron-Core gathers the QKV output across TP and slices "
                     f"each rank's heads (megatron/core/transformer/attention.py), which needs megatron-core "
                     f"0.16.0 or later; earlier versions refuse query groups fewer than TP")


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
    fam = m.model_family
    if fam.mlp == "geglu" or fam.norm_unit_offset or fam.embedding_scale:
        # --swiglu and plain RMSNorm would train another model than the plan's
        raise PlanError(f"Megatron-LM's arguments have no GeGLU MLP, (1 + weight) RMSNorm or scaled embedding, which "
                        f"the model '{m.name}' (family '{m.family}') has, so it is not exported to Megatron-LM")
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
