"""The rows of benchmarks/published/runs.csv as the planner's inputs: a ModelSpec, a ClusterSpec, a TrainingShape and
the Pins of the published layout, with a note of every approximation the model spec needs. Shared by
benchmarks/published_check.py (plans every row) and benchmarks/fit_megatron_target.py (fits the Megatron target's
free factors on the fit rows only).

A row whose GPU kind the planner does not know, or for which no profile ships, is 'skipped' with the reason; it is
picked up without a change here once the kind and its profile exist (planner.cluster.GPU_KINDS, profiles/).
"""
from __future__ import annotations

import csv
from dataclasses import dataclass, field, replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUNS_CSV = REPO / "benchmarks" / "published" / "runs.csv"

from planner.cluster import GPU_KINDS, ClusterSpec  # noqa: E402
from planner.cost.targets import attention_fa2  # noqa: E402
from planner.model import ModelSpec  # noqa: E402
from planner.memory import Fp8ActivationCache, StateStorage  # noqa: E402
from planner.plan import TrainingShape  # noqa: E402
from planner.profile import Profile, load_profile  # noqa: E402
from planner.profile.files import shipped_profile_path  # noqa: E402
from planner.search import Pins  # noqa: E402

HEAD_DIM = {"GPT-OSS-120B": 64, "Qwen3-235B-A22B": 128}
"""Per-head width of the rows whose head_dim is not hidden / heads (runs.csv has no such column): the released
config.json files (openai/gpt-oss-120b head_dim 64; Qwen/Qwen3-235B-A22B head_dim 128)."""

MLA_KV_GROUPS = 8
"""KV groups of the grouped-query attention that stands for DeepSeek-V3's multi-head latent attention (empty kv_heads).
MLA's weights per layer (DeepSeek-V3 config.json: hidden 7168, 128 heads, q_lora_rank 1536, kv_lora_rank 512,
qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128): q down 7168 x 1536, q up 1536 x 128 x 192, kv down
7168 x 576, kv up 512 x 128 x 256, out 128 x 128 x 7168 = 187M. Multi-head attention with 128-wide heads counts
7168 x 3 x 16384 + 16384 x 7168 = 470M (2.5x; so 2.5x the weights' states and their GEMM time); with 8 KV groups
7168 x (16384 + 2 x 1024) + 16384 x 7168 = 249M, and q, k, v saved per token 18432 wide against 49152 (Megatron-Core
recomputes MLA's up-projections under recompute_modules 'mla_up_proj' and keeps the latents). 8 groups divide every
TP degree the search tries up to 8."""

VOCAB_MULTIPLE = 1024
"""Vocabularies are padded to a multiple of 128 x 8 (Megatron's --make-vocab-size-divisible-by 128 times the largest TP
degree searched), so that every TP degree divides them (GPT-3's 50257 -> 51200)."""

MLP_FAMILY = {"gelu": "gpt", "swiglu": "llama", "relu2": "gpt"}
"""The model family whose MLP is closest to the row's: GELU -> GPT (two matmuls, biases, LayerNorm, learned
positions); SwiGLU -> Llama (three matmuls, RMSNorm, rotary); squared ReLU (Nemotron) -> GPT (two matmuls like
GELU; Nemotron has no biases and uses rotary: approximated, the row says so)."""


@dataclass
class PublishedRow:
    row_id: str
    split: str
    raw: dict
    model: ModelSpec
    cluster: ClusterSpec
    shape: TrainingShape
    pins: Pins
    tokens_per_s_per_gpu: float
    notes: list[str] = field(default_factory=list)
    skip_reason: str = ""
    """Why the row cannot be planned on this tree ('' when it can)."""

    @property
    def fp8(self) -> bool:
        return self.raw["precision"] == "fp8"

    def profile(self) -> Profile:
        """The GPU's measured profile, not its calibrated one where one ships: a calibration's factors are fitted
        on our runtime's runs, and the runtime targets' own factors (profiles/targets/megatron.json) are fitted over
        the measured kernel and collective times."""
        return load_profile(str(shipped_profile_path(self.cluster.gpu)), self.cluster.gpu)


MEGATRON_CORE_SOURCES = ("nemo2407", "mbridge")
"""Sources run on Megatron-Core, whose gradients are reduced in bf16 by default (DistributedDataParallelConfig
grad_reduce_in_fp32 False): planned with grad_dtype bf16. Narayanan's and Korthikanti's Megatron-LM of 2021-22
accumulated and reduced in fp32 in their fp16 / bf16 runs, and the others are not Megatron."""

VPP_FREE_SOURCES = ("llama3",)
"""Sources whose interleaving is stated but not its degree (Llama 3 section 3.3.2: an interleaved schedule): an empty
vpp is left to the search there; elsewhere it is 1."""

SYNCHRONOUS_TP_SOURCES = ("nar21", "titan24")
"""Sources whose runtime issues every TP collective on the critical path when the TP overlap is off, unlike the
megatron target's Megatron-LM (RuntimeTarget.tp_backward_beside_gemms): Narayanan 2021's Megatron-LM predates the
asynchronous backward collectives (arXiv 2104.04473 of April 2021; Megatron-LM commit cf7efd4f5a of 2021-08-30);
torchtitan's TP (DTensor) overlaps nothing without AsyncTP (arXiv 2410.06511 section 3.2, AsyncTP is the overlap)."""

PYTORCH_TP_OVERLAP_SOURCES = ("titan24",)
"""Sources whose TP overlap is PyTorch's own, not Megatron's userbuffers: torchtitan's AsyncTP (arXiv 2410.06511
section 3.2; torch.distributed's micro-pipelined all-gather-matmul and matmul-reduce-scatter over symmetric memory).
Planned at the TP fraction the profile measured for our runtime's PyTorch overlap (RuntimeTarget.tp_hidden_fraction
None), not the megatron target's fitted one."""

FA2_SOURCES = ("titan24",)
"""Sources whose attention ran FlashAttention-2 (RuntimeTarget.attention_fwd_factor, planner.cost.targets.
attention_fa2): torchtitan at 9dec370 calls F.scaled_dot_product_attention (torchtitan/models/llama/model.py) with
torch 1963fc8 (2024-12-23), whose SDPA tried flash first on H100 (cuDNN made opt-in by pytorch/pytorch#138522,
2024-10-21); with context parallel it pins the flash and efficient backends (torchtitan/utils.py,
get_train_context)."""

PYTORCH_CP_SOURCES = ("titan24",)
"""Sources whose context parallel is PyTorch's experimental context_parallel as torchtitan ran it: K and V expanded to
the query heads before attention, gathered in one all-gather per pass (RuntimeTarget.cp_kv_expanded,
cp_kv_all_gather; torchtitan 9dec370 sets the rotate method 'allgather', torchtitan/utils.py
create_context_parallel_ctx), the blocks merged and dQ, dK, dV accumulated and passed in fp32 (cp_fp32_buffers; torch
2.6's _ContextParallelOptions convert_to_f32 default, which torchtitan leaves alone)."""

EAGER_ROWS = ("titan24-01",)
"""Rows whose runtime ran the model's elementwise ops eagerly, without torch.compile
(RuntimeTarget.eager_llama_elementwise): torchtitan's Table 3 row 'FSDP' (arXiv 2410.06511; the same table in
pytorch/torchtitan docs/performance.md at d4c86e375, runs of torchtitan 9dec370, whose llama3_8b.toml sets `compile =
false` unless asked). Its other rows say torch.compile: Table 3's 'FSDP + torch.compile' and '+ Float8' in the row
name, Tables 4 to 6 in their captions ('2D parallelism (FSDP + TP) + torch.compile + Float8', '3D parallelism
(FSDP + TP + PP) + torch.compile + Float8 + AsyncTP', '4D parallelism (FSDP + TP + PP + CP) + torch.compile +
Float8 + AsyncTP + 1F1B'). Matched by row id, not by source: the trait is the row's."""

EXPOSED_ALL_GATHER_CP_SOURCES = ("llama3",)
"""Sources whose context parallel gathers K and V (with their own, GQA, heads) in one all-gather on the critical path:
Llama 3 section 3.3.2, "we first all-gather the key (K) and value (V) tensors, and then compute attention output for
the local query (Q) tensor chunk. Although the all-gather communication latency is exposed in the critical path, we
still adopt this approach" (RuntimeTarget.cp_kv_all_gather, cp_hidden_fraction 0)."""

DUAL_PIPE_SOURCES = ("dsv3",)
"""Sources whose pipeline is DeepSeek-V3's DualPipe (RuntimeTarget.dual_pipe; arXiv 2412.19437 section 3.2.1): its
forward and backward chunks of two micro-batches overlap, hiding the all-to-alls beside the other micro-batch's
chunk as the batch-level overlap does, wholly where the chunk is long enough ("both all-to-all and PP communication
can be fully hidden": ep_hidden_fraction 1, not Megatron's fitted fraction)."""

FP8_ACTIVATION_CACHE_SOURCES = ("dsv3",)
"""Sources that stored activations as DeepSeek-V3 did (RuntimeTarget.fp8_activation_cache; arXiv 2412.19437 sections
3.2.3 and 3.3.3): norms and MLA up-projections recomputed, Linear inputs cached in FP8 (the attention output in
E5M6), SwiGLU outputs recomputed from their FP8 inputs. MLA's latents stand for q, k and v (MLA_LATENT_WIDTH)."""

MLA_LATENT_WIDTH = 1536 + 512 + 64
"""DeepSeek-V3 config.json: q_lora_rank + kv_lora_rank + qk_rope_head_dim, the up-projections' inputs kept per token."""

LEGACY_MEGATRON_SOURCES = ("nar21", "kor22")
"""Sources run on Megatron-LM as it was in 2021-22 (A100, before Transformer Engine). Priced at the target's
legacy_compute_factor, fitted on Narayanan's rows (fit) and checked on Korthikanti's (holdout), so that the factor
of today's Megatron-Core (compute_factor) comes from the rows that ran it; and with the attention core unfused
(RuntimeTarget.unfused_attention): batched GEMMs over the whole s x s scores, Megatron's fused causal softmax and
dropout between them (megatron/model/transformer.py at a8d172b31e, April 2021, and at f602ac56bd, May 2022;
FlashAttention reached Megatron-LM in 2023). Korthikanti et al. 2022 name this core (QK^T, softmax, dropout,
attention over V) as what selective recompute reruns."""

EVEN_SPLIT_SOURCES = ("nar21", "kor22", "nemo2407", "mbridge")
"""Sources run on Megatron-LM / Megatron-Core, which split the layers evenly over the pipeline's chunks unless a run
asks otherwise (TransformerConfig: account_for_embedding_in_pipeline_split, account_for_loss_in_pipeline_split,
pipeline_model_parallel_layout and the first/last stage layer counts all default off; e.g. Megatron-Bridge's GPT-OSS
120B recipe sets both account_for_* False and no layout, src/megatron/bridge/recipes/gpt_oss/gpt_oss.py at r0.4.0,
3743c703d1, the 26.04.01 container's branch). Where the layers divide by PP x VPP the pinned plan keeps that split
(megatron_split); where they do not, the run must have split them its own way, and the planner's split stands."""

APEX_ADAM_FP8_SOURCES = ("nemo2407",)
"""Sources run on NeMo 1.x with Apex's DistributedFusedAdam and FP8 parameters, whose states are counted as that
optimizer keeps them (APEX_ADAM_FP8_STORAGE, RuntimeTarget.state_storage). The performance summary names no config.
NeMo-Framework-Launcher's recipes at tag 24.07 (launcher_scripts/conf/training/, e.g. nemotron/nemotron_340b.yaml) set
optim `distributed_fused_adam` with `dtype: bf16`, `grad_sync_dtype: bf16` and `contiguous_grad_buffer: True`, with
`megatron_amp_O2: true`; NVIDIA's benchmark configuration of these models (NVIDIA/dgxc-benchmarking,
nemotron/configure.sh and nemotron4-340b-synth.yaml) adds `+model.fp8_params=True` to its FP8 runs, and its README's
FP8 result for Nemotron-340B on 128 GPUs, 41,478 tokens/s (about 324 a GPU, a later container), is the summary's
row (322). That FP8 runs of the summary held FP8 parameters is taken from that configuration."""

APEX_ADAM_FP8_STORAGE = StateStorage(weight_bytes=2.0, grad_bytes=2.0, sharded_bytes=8.0)
"""Apex's DistributedFusedAdam (apex/contrib/optimizers/distributed_fused_adam.py, 2024) as NeMo 1.x builds it with
those settings (nemo/core/optim/distributed_adam.py: dtype bf16, store_params True because of fp8_params), per
parameter: on every rank the FP8 weight (1 B) and Transformer Engine's cached FP8 transpose of it (1 B, kept between
steps), and the bf16 contiguous gradient buffer (2 B); over the data-parallel ranks the bf16 master copy, the bf16
exp_avg and exp_avg_sq, and the bf16 reduce-scatter shard of the gradient kept until zero_grad (2 B each). The word
embeddings' fp32 gradient synchronisation (2 B more a parameter on the end stages) is not counted."""

RECOMPUTE_FREE_SOURCES = ("dsv3",)
"""Sources whose named recompute is a set of their own that the planner's none / selective / full cannot express."""


def _int(s: str, default: int | None = None) -> int | None:
    return int(s) if s.strip() else default


def _flag(s: str) -> bool | None:
    return {"true": True, "false": False}.get(s.strip().lower())


def model_of(r: dict, notes: list[str]) -> ModelSpec:
    family = MLP_FAMILY[r["mlp"]]
    if r["mlp"] == "relu2":
        notes.append("squared-ReLU MLP priced as GPT's GELU MLP (two matmuls; biases and learned positions of the "
                     "GPT family kept)")
    heads = int(r["heads"])
    kv = _int(r["kv_heads"], heads)
    if not r["kv_heads"].strip():
        kv = MLA_KV_GROUPS
    experts = _int(r["num_experts"], 1)
    ffn = _int(r["moe_ffn_hidden"]) if experts > 1 else _int(r["ffn_hidden"])
    if experts > 1 and r["ffn_hidden"].strip():
        notes.append(f"dense layers (FFN {r['ffn_hidden']}) priced as MoE layers like the rest (the model spec has "
                     "one layer kind)")
    if not r["kv_heads"].strip():
        notes.append(f"MLA (compressed latent KV) approximated as grouped-query attention with 128-wide heads and "
                     f"{MLA_KV_GROUPS} KV groups (attention weights 249M per layer against MLA's 187M)")
    hidden = int(r["hidden"])
    head_dim = HEAD_DIM.get(r["model"], 0)
    if not r["kv_heads"].strip():
        head_dim = 128
    if head_dim and head_dim == hidden // heads:
        head_dim = 0
    shared = _int(r["shared_experts"], 0) or 0
    vocab = int(r["vocab"])
    padded = -(-vocab // VOCAB_MULTIPLE) * VOCAB_MULTIPLE
    if padded != vocab:
        notes.append(f"vocabulary {vocab} padded to {padded} (Megatron pads to a multiple of 128 x TP)")
    seq = int(r["seq_len"])
    return ModelSpec(name=r["model"], family=family, num_layers=int(r["layers"]), hidden=hidden, num_heads=heads,
                     num_kv_heads=kv, ffn_hidden=ffn, vocab_size=padded, max_seq_len=max(seq, 2048),
                     default_seq_len=seq, default_global_batch=int(r["global_batch_seqs"]), num_experts=experts,
                     top_k=_int(r["top_k"], 1) if experts > 1 else 1, shared_expert_ffn=shared * (ffn or 0),
                     head_dim_override=head_dim, tie_embeddings=False, rope_theta=500000.0)


def pins_of(r: dict, notes: list[str]) -> Pins:
    """The published layout: TP, PP, VPP, DP and its sharding, CP, EP, micro-batch, recompute and FP8; an empty
    cell stays free. Overlap switched off where the row says it was off (tp_comm_overlap / dp_overlap false)."""
    sharding = r["sharding"].strip() or None
    if sharding is None and _flag(r["distributed_optimizer"]) is True:
        sharding = "optimizer"
    if sharding is None and _flag(r["distributed_optimizer"]) is False:
        sharding = "none"
    vpp = _int(r["vpp"])
    if vpp is None and (int(r["pp"]) == 1 or not r["row_id"].startswith(VPP_FREE_SOURCES)):
        vpp = 1  # runs.csv: empty means no interleaving stated (NeMo's VP 1 is written empty; torchtitan's rows 1F1B)
    recompute = r["recompute"].strip() or None
    if recompute and r["row_id"].startswith(RECOMPUTE_FREE_SOURCES):
        notes.append(f"recompute '{recompute}' is the source's own set (DeepSeek-V3: RMSNorm, MLA up-projections and "
                     "SwiGLU outputs recomputed, MoE inputs cached in FP8), not the planner's selective recompute: "
                     "left to the search")
        recompute = None
    tp, dp, cp, ep = int(r["tp"]), int(r["dp"]), int(r["cp"]), int(r["ep"])
    if ep > 1 and (dp * cp) % ep:
        fit_ep = max(e for e in range(1, dp * cp + 1) if (dp * cp) % e == 0 and ep % e == 0)
        notes.append(f"EP {ep} spans TP x DP in Megatron (expert tensor parallel 1); planned as EP {fit_ep}, the "
                     f"largest degree that divides DP x CP = {dp * cp} here")
        ep = fit_ep
    no_overlap = set()
    if _flag(r["tp_comm_overlap"]) is False or (_flag(r["sequence_parallel"]) is False and int(r["tp"]) > 1):
        no_overlap.add("tp")  # without sequence parallelism Megatron all-reduces TP outputs on the critical path
    if _flag(r["dp_overlap"]) is False:
        no_overlap.add("dp")
    return Pins(tp=tp, pp=int(r["pp"]), vpp=vpp, dp=dp, cp=cp, ep=ep,
                micro_batch=_int(r["micro_batch"]), sharding=sharding, recompute=recompute,
                fp8=r["precision"] == "fp8", no_overlap=frozenset(no_overlap), cuda_graph=False,
                grad_dtype="bf16" if r["row_id"].startswith(MEGATRON_CORE_SOURCES) else "fp32")


def skip_reason(gpu: str) -> str:
    if gpu not in GPU_KINDS:
        return f"GPU kind '{gpu}' is not in planner.cluster.GPU_KINDS on this tree"
    if not shipped_profile_path(gpu).exists():
        return f"no profile ships for GPU kind '{gpu}' on this tree"
    return ""


def load_rows(path: Path = RUNS_CSV, split: str | None = None) -> list[PublishedRow]:
    """Every row of runs.csv (or of one split), in file order."""
    out = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            if split is not None and r["split"] != split:
                continue
            notes: list[str] = []
            model = model_of(r, notes)
            seq, gb = int(r["seq_len"]), int(r["global_batch_seqs"])
            gpus = int(r["num_gpus"])
            cluster = ClusterSpec(gpu=r["gpu"], num_gpus=gpus, gpus_per_node=min(int(r["gpus_per_node"]), gpus),
                                  inter_node_gb_per_s=float(r["inter_node_gbps_per_gpu"]))
            out.append(PublishedRow(row_id=r["row_id"], split=r["split"], raw=r, model=model, cluster=cluster,
                                    shape=TrainingShape(seq_len=seq, global_batch=gb), pins=pins_of(r, notes),
                                    tokens_per_s_per_gpu=float(r["tokens_per_s_per_gpu"]), notes=notes,
                                    skip_reason=skip_reason(r["gpu"])))
    return out


DECIDING_TERMS = {"tp_comm": "exposed TP comm", "dp_comm": "exposed DP comm", "pp_comm": "exposed PP comm",
                  "bubble": "bubble", "cp_comm": "exposed CP comm", "ep_comm": "exposed EP comm", "host": "host",
                  "recompute": "memory (recompute)", "optimizer": "optimizer"}
"""The breakdown's parts beyond compute, as a miss names the one that decided it."""

SMALL_PART = 0.05
"""A part beyond compute smaller than this share of the step does not decide a miss: the label names compute."""


def deciding_term(prediction, over: bool = False) -> str:
    """The part of a predicted step that decided a miss, as a label: the largest part beyond compute (planner.breakdown's
    names) where the prediction is too slow (or the free search below the published figure); where it is too fast
    (`over`), the run spent time the model does not price, and the label gives the compute share the miss sits in and
    the largest other part."""
    parts = {k: prediction.breakdown_s.get(k, 0.0) for k in DECIDING_TERMS}
    k = max(parts, key=parts.get)
    largest = f"{DECIDING_TERMS[k]} ({parts[k] / prediction.step_s:.0%} of the step)"
    compute = prediction.breakdown_s.get("compute", 0.0) / prediction.step_s
    if over:
        return f"unpriced time: compute {compute:.0%} of the predicted step; largest other part {largest}"
    if parts[k] < SMALL_PART * prediction.step_s:  # nothing beyond compute decides: the kernels' time itself
        return f"compute ({compute:.0%} of the step; largest other part {largest})"
    return largest


def row_target(row: PublishedRow, target):
    """`target` as the row's runtime ran: without the asynchronous backward TP collectives for the sources that
    predate or lack them (SYNCHRONOUS_TP_SOURCES); with Megatron-Core's batch-level EP A2A overlap where the row's
    `ep_overlap` says the run used it (RuntimeTarget.ep_a2a_beside_layer; benchmarks/published/README.md gives each
    row's source config); with the per-node deduplicated dispatch and its node limit where `ep_dispatch` is
    'per_node' (RuntimeTarget.ep_dispatch_per_node, ep_route_groups, ep_group_limit); PyTorch's TP overlap at the
    profile's fraction (PYTORCH_TP_OVERLAP_SOURCES), FlashAttention-2 (FA2_SOURCES) and PyTorch's context parallel
    (PYTORCH_CP_SOURCES) for torchtitan, and its eager elementwise ops where a row ran without torch.compile
    (EAGER_ROWS); Llama 3's exposed all-gather context parallel (EXPOSED_ALL_GATHER_CP_SOURCES);
    DeepSeek-V3's DualPipe (DUAL_PIPE_SOURCES) and FP8 activation cache (FP8_ACTIVATION_CACHE_SOURCES); Apex's
    distributed Adam with FP8 parameters (APEX_ADAM_FP8_SOURCES); 2021-22
    Megatron-LM's unfused attention core and its own kernel factor (LEGACY_MEGATRON_SOURCES). Our own runtime's target
    ('ours') is returned unchanged."""
    if getattr(target, "name", "ours") == "ours":
        return target
    if getattr(target, "tp_backward_beside_gemms", False) and row.row_id.startswith(SYNCHRONOUS_TP_SOURCES):
        target = replace(target, tp_backward_beside_gemms=False)
    if getattr(target, "ep_a2a_beside_layer", False) and not _flag(row.raw.get("ep_overlap", "")):
        target = replace(target, ep_a2a_beside_layer=False)  # ran without Megatron's batch-level EP overlap
    if row.row_id.startswith(PYTORCH_TP_OVERLAP_SOURCES):
        target = replace(target, tp_hidden_fraction=None)  # PyTorch's AsyncTP, priced as our runtime's overlap
    if row.row_id.startswith(FA2_SOURCES):
        target = attention_fa2(target)
    if row.row_id.startswith(PYTORCH_CP_SOURCES):
        target = replace(target, cp_kv_expanded=True, cp_kv_all_gather=True, cp_fp32_buffers=True)
    if row.row_id in EAGER_ROWS:  # no torch.compile: each op of torchtitan's Llama code its own kernel
        target = replace(target, eager_llama_elementwise=True)
    if row.row_id.startswith(EXPOSED_ALL_GATHER_CP_SOURCES):
        target = replace(target, cp_kv_all_gather=True, cp_hidden_fraction=0.0)
    if row.row_id.startswith(DUAL_PIPE_SOURCES):  # "both all-to-all and PP communication can be fully hidden"
        target = replace(target, dual_pipe=True, ep_a2a_beside_layer=True, ep_hidden_fraction=1.0)
    if row.row_id.startswith(LEGACY_MEGATRON_SOURCES):
        target = replace(target, unfused_attention=True, compute_factor=target.legacy_compute_factor)
    if row.row_id.startswith(APEX_ADAM_FP8_SOURCES) and row.pins.fp8:
        target = replace(target, state_storage=APEX_ADAM_FP8_STORAGE)
    if row.row_id.startswith(FP8_ACTIVATION_CACHE_SOURCES):
        target = replace(target, fp8_activation_cache=Fp8ActivationCache(mla_latent_width=MLA_LATENT_WIDTH))
    if row.raw.get("ep_dispatch", "") == "per_node":  # DeepEP / DeepSeek-V3's kernels: once per node over IB
        groups, limit = (row.raw.get(k, "") for k in ("ep_route_groups", "ep_group_limit"))
        target = replace(target, ep_dispatch_per_node=True, ep_route_groups=int(groups) if groups else 0,
                         ep_group_limit=int(limit) if limit else 0)
    return target


def plan_row(row: PublishedRow, target, free: bool = False, profile: Profile | None = None):
    """The best plan of `row` for `target`: pinned to the published layout, or (free) searched with only its
    numerics kept (FP8 or not, and the main gradients' precision, which Megatron-Core keeps in bf16 where the
    others keep fp32: Pins.grad_dtype is a numerics choice the search does not make). Raises
    planner.errors.PlanError (NoFitError when no layout fits in memory)."""
    from planner.search import search

    pins = Pins(fp8=row.pins.fp8, grad_dtype=row.pins.grad_dtype, cuda_graph=False) if free else row.pins
    profile = profile or row.profile()
    result = search(row.model, row.shape, row.cluster, profile, pins, top_k=1, target=row_target(row, target))
    plan = result.plans[0]
    return plan if free else megatron_split(row, plan, target, profile)


def megatron_split(row: PublishedRow, plan, target, profile: Profile):
    """`plan` with its layers split evenly over the pipeline's chunks where the row's runtime splits them so and
    they divide (EVEN_SPLIT_SOURCES); each rank's recompute refitted to memory (the pin's mode if pinned)."""
    from planner.cost import CostModel
    from planner.memory import plan_memory_limit_bytes
    from planner.search.stages import stages_with_layer_counts

    chunks = plan.layout.pp * plan.layout.vpp
    layers = row.model.num_layers
    if not row.row_id.startswith(EVEN_SPLIT_SOURCES) or chunks == 1 or layers % chunks:
        return plan
    even = [layers // chunks] * chunks
    if [s.layers for s in plan.stages] == even:
        return plan
    cm = CostModel(row.model, row.shape, plan.layout, row.cluster, profile, target=row_target(row, target))
    stages = stages_with_layer_counts(cm, row.shape, plan_memory_limit_bytes(row.cluster), even, row.pins.recompute)
    if stages is None:
        return plan  # the even split does not fit as the planner counts memory: keep the planner's
    return replace(plan, stages=stages, prediction=cm.predict(stages))


def repredict(row: PublishedRow, plan, target, profile: Profile, play: bool = True):
    """The prediction of `plan` (its layout and stages kept) under another target's factors; play=False times the
    pipeline by the schedule's closed form (planner/cost/step.py, CostModel.predict)."""
    from planner.cost import CostModel

    return CostModel(row.model, row.shape, plan.layout, row.cluster, profile,
                     target=row_target(row, target)).predict(plan.stages, play=play)


def tokens_per_s_per_gpu(row: PublishedRow, prediction) -> float:
    return prediction.tokens_per_s / row.cluster.num_gpus
