"""Step time of a plan: plain arithmetic over named quantities, every time looked up in the profile.

Per layer and micro-batch on one rank (`LayerCosts`): GEMMs forward and backward (dgrad + wgrad) at the
shapes the runtime runs (tensor-parallel shards, sequence-parallel gathers), flash attention forward and
backward, elementwise kernels (norms, Qwen3's q/k norms, activations, rotary, residual adds) at the profile's
achieved bandwidth, and the communication beside them: tensor-parallel all-gather / reduce-scatter, the context-
parallel ring's K/V passes, the expert all-to-alls. Communication that an overlapped implementation hides
is at most the profile's hidden fraction of it and at most the compute it runs beside.

Per step: the runtime's pipeline schedule (1F1B or interleaved) played with each virtual stage's forward
and backward time and a hop time between ranks (planner/schedule.py: the warm-up and cool-down, and the
transfers' waits, come out of the play), then the data-parallel gradient / parameter traffic that backward
and forward do not hide, then the optimizer step over the local parameter shard.
"""
from __future__ import annotations

from dataclasses import dataclass

from planner import memory as mem
from planner.cluster import ClusterSpec, place_group
from planner.legality import GROUPED_GEMM_GPUS
from planner.model import ModelSpec
from planner.plan import Layout, Plan, Prediction, StagePlan, TrainingShape
from planner.profile import Profile
from planner.schedule import closed_form_s, pipeline_time_s

BF16 = 2
FP32 = 4

ADAMW_GRAD_SCALE = {"fp32": 1.0, "bf16": 28.0 / 30.0}
"""The profiled AdamW step (optimizer_s_per_param) reads an fp32 gradient: 30 B of traffic per parameter (master,
m, v read and written, 4 B each; gradient read, 4 B; bf16 weight written, 2 B). With bf16 gradients it reads 2 B
of gradient: 28 B, and a memory-bound kernel's time scales with its bytes (modelled, not profiled)."""


class cached_property:  # noqa: N801 - functools' version takes a lock per access on Python < 3.12
    def __init__(self, fn):
        self.fn, self.name = fn, fn.__name__
        self.__doc__ = fn.__doc__

    def __get__(self, obj, cls=None):
        if obj is None:
            return self
        value = obj.__dict__[self.name] = self.fn(obj)
        return value


def exposed_s(comm_s: float, beside_s: float, hidden_fraction: float, overlap: bool) -> float:
    """Communication left on the critical path when it runs beside `beside_s` of compute."""
    if not overlap:
        return comm_s
    return comm_s - min(hidden_fraction * comm_s, beside_s)


def two_chunk_exposed_s(transfer_s: float, experts_s: float) -> float:
    """What an MoE layer's all-to-alls add to its experts' time, one direction (forward or backward), with the
    tokens dispatched in two chunks (Layout.overlap_ep, runtime/parallel/expert.py): chunk 0's dispatch alone,
    chunk 1's beside chunk 0's experts, chunk 0's combine beside chunk 1's experts, chunk 1's combine alone.
    transfer_s: one chunk's all-to-all; experts_s: one chunk's experts. The transfers share one stream."""
    return 2 * transfer_s + 2 * max(experts_s, transfer_s) - 2 * experts_s


@dataclass(frozen=True)
class LayerCosts:
    """One transformer layer, one micro-batch, one rank; seconds."""

    fwd_compute_s: float
    bwd_compute_s: float
    fwd_comm_s: float
    """Exposed communication in forward (tp + cp + ep)."""
    bwd_comm_s: float
    selective_recompute_s: float
    """Extra backward time of a selectively recomputed layer."""
    comm_by_dim_s: dict
    """Exposed forward + backward communication per dimension, for the breakdown."""

    @property
    def fwd_s(self) -> float:
        return self.fwd_compute_s + self.fwd_comm_s

    @property
    def fwd_bwd_s(self) -> float:
        return self.fwd_s + self.bwd_compute_s + self.bwd_comm_s

    @property
    def full_recompute_s(self) -> float:
        return self.fwd_s


@dataclass(frozen=True)
class EndCosts:
    """Embedding (first stage) and output layer + loss (last stage), one micro-batch; seconds."""

    embedding_s: float
    head_s: float
    head_comm_s: float


@dataclass(frozen=True)
class MemoryTerms:
    base_bytes: float
    state_per_layer_bytes: float
    in_flight: list
    none_bytes: float
    sel_saving_bytes: float
    full_saving_bytes: float

    def bytes(self, counts, full, sel) -> float:
        total = self.base_bytes + (self.none_bytes if any(full) else 0.0)
        for k, n, f, s in zip(self.in_flight, counts, full, sel):
            total += (self.state_per_layer_bytes + k * self.none_bytes) * n - k * (self.full_saving_bytes * f + self.sel_saving_bytes * s)
        return total


class CostModel:
    """Costs of one (model, shape, layout) on one cluster with one profile; the search builds one per
    candidate layout and asks it about many stage splits."""

    def __init__(self, model: ModelSpec, shape: TrainingShape, layout: Layout, cluster: ClusterSpec,
                 profile: Profile, shared: dict | None = None):
        self.m, self.shape, self.lay, self.cluster, self.prof = model, shape, layout, cluster, profile
        # layer and end costs depend only on (tp, cp, ep, micro-batch, overlap, fp8, gradient precision): a
        # search shares them
        self._shared = shared if shared is not None else {}
        self.layer_key = (layout.tp, layout.cp, layout.ep, layout.micro_batch, layout.overlap_tp, layout.fp8,
                          layout.grad_dtype, self.dispatch_chunks, self.stacks_expert_weights)
        """What a layer's price depends on: the key of its memo in `shared`."""

    @property
    def stacks_expert_weights(self) -> bool:
        """Whether the MoE layer copies its local expert weights into one tensor per use (sharding levels whose
        buffers cannot hold them back to back; see _layer): part of the layer's price, so of its memo key."""
        return self.m.is_moe and self.lay.sharding in ("optimizer+grads", "full")

    @property
    def dispatch_chunks(self) -> int:
        """Chunks an MoE layer dispatches its tokens in (runtime/parallel/expert.py, MoEMLP.dispatch_chunks)."""
        return 2 if self.lay.overlap_ep and self.lay.ep > 1 and self.m.is_moe else 1

    def _memo(self, name, fn):
        k = (name, self.layer_key)
        v = self._shared.get(k)
        if v is None:
            v = self._shared[k] = fn()
        return v

    # -- communication pricing ----------------------------------------------------------------------
    def group_collective_s(self, op: str, size_bytes: float, size: int, stride: int) -> float:
        """A collective over `size` ranks spaced `stride` apart, priced by where the group sits."""
        if size <= 1 or size_bytes <= 0:
            return 0.0
        key = ("coll", op, size_bytes, size, stride)
        v = self._shared.get(key)
        if v is None:
            v = self._shared[key] = self._group_collective_s(op, size_bytes, size, stride)
        return v

    def _group_collective_s(self, op: str, size_bytes: float, size: int, stride: int) -> float:
        if place_group(self.cluster, size, stride).link == "nvlink":
            # inside a node: the profile's measured points (log-log between them; its fitted line outside
            # them). The line alone ran 10-27% under the points at 1-16 MiB, where NCCL changes protocol.
            return self.prof.collective_s(op, size_bytes, size, "nvlink")
        key = ("link", op, size, stride)
        link = self._shared.get(key)
        if link is None:
            link = self._shared[key] = self._link_model(op, size, stride)
        latency_s, bus_bw = link
        from planner.profile import bus_factor
        return latency_s + size_bytes * bus_factor(op, size) / bus_bw

    def _link_model(self, op: str, size: int, stride: int) -> tuple[float, float]:
        """(latency, bus bandwidth) of a collective over a group that spans nodes (inside a node the measured
        points price it: _group_collective_s)."""
        place = place_group(self.cluster, size, stride)
        fit = self.prof.collective(op, size, "nvlink")
        # across nodes (modelled): NCCL's ring is limited by the slowest link on it, the per-GPU NIC; the
        # latency is NVLink's for the intra-node hops plus the network's per inter-node step
        bw = min(fit.bus_bandwidth_bytes_per_s, place.bottleneck_gb_per_s * 1e9)
        steps = max(size // max(place.ranks_per_node, 1) - 1, 1)
        return fit.latency_s + steps * self.cluster.inter_node_latency_us * 1e-6, bw

    @cached_property
    def strides(self) -> dict:
        lay = self.lay
        return {"tp": 1, "cp": lay.tp, "dp": lay.tp * lay.cp, "pp": lay.tp * lay.cp * lay.dp,
                "ep": lay.tp}  # expert groups: consecutive ranks of dp x cp, spaced by tp

    @cached_property
    def activations(self) -> mem.LayerActivations:
        return self._memo("activations", lambda: mem.layer_activations(self.m, self.shape, self.lay))

    # -- per layer -----------------------------------------------------------------------------------
    @cached_property
    def tokens(self) -> float:
        """Tokens of one micro-batch on one rank (all of them after the sequence-parallel gather)."""
        return self.lay.micro_batch * self.shape.seq_len / self.lay.cp

    def _gemm_fwd_bwd_s(self, m: int, n: int, k: int, fp8: bool = False) -> tuple[float, float]:
        """Forward [m,k]x[k,n]; backward dgrad dY W = [m,n]x[n,k] and wgrad dY^T X = [n,m]x[m,k], keyed as
        the runtime calls them (and the profiler times them). fp8: forward and dgrad as FP8 GEMMs (modelled,
        Profile.fp8_gemm_s), wgrad in bf16 as the runtime runs it. The wgrad accumulates into fp32 (the profile's
        wgrad table) unless the gradients are bf16, where it writes bf16 like any GEMM (the bf16-output table,
        whose layouts are forward's and dgrad's: modelled)."""
        (tf, *f), (td, *d), (tw, *w) = self._gemm_queries(m, n, k, fp8)
        return self.prof.gemm_table_s(tf, *f), self.prof.gemm_table_s(td, *d) + self.prof.gemm_table_s(tw, *w)

    def _gemm_queries(self, m: int, n: int, k: int, fp8: bool = False) -> list[tuple[str, int, int, int]]:
        """(profile table, m, n, k) of the forward, dgrad and wgrad GEMMs of a linear layer [m,k]x[k,n]."""
        mm = "fp8" if fp8 else "mm"
        return [(mm, m, n, k), (mm, m, k, n), ("mm" if self.lay.grad_dtype == "bf16" else "wgrad", n, k, m)]

    @cached_property
    def layer(self) -> LayerCosts:
        return self._memo("layer", self._layer)

    def layer_gemms(self) -> list[tuple[int, int, int]]:
        """(m, n, k) of the dense layer's linear GEMMs on one rank, forward layout (qkv, out-projection, and
        without MoE fc1 and fc2); each also runs as dgrad and wgrad (_gemm_fwd_bwd_s)."""
        m, t = self.m, self.lay.tp
        T = int(self.tokens)
        gemms = [(T, (m.q_width + 2 * m.kv_width) // t, m.hidden), (T, m.hidden, m.q_width // t)]
        if not m.is_moe:
            gemms += [(T, (2 if m.gated_mlp else 1) * m.ffn_hidden // t, m.hidden), (T, m.hidden, m.ffn_hidden // t)]
        return gemms

    def interpolated_gemms(self) -> tuple[int, int]:
        """(how many of the layer's GEMM queries, forward, dgrad and wgrad, the profile answers by interpolation
        or a model rather than from a measured point, of how many)."""
        queries = [q for shape in self.layer_gemms() for q in self._gemm_queries(*shape, self.lay.fp8)]
        return sum(not self.prof.gemm_measured(*q) for q in queries), len(queries)

    def _qk_norm_s(self, tokens: int) -> tuple[float, float]:
        """(forward, backward) seconds of Qwen3's q/k norms on one rank (ModelSpec.qk_norm; 0 without them), as
        runtime/qk_norm.py runs them on the GPU: one kernel over the qkv GEMM output in its own layout each way.
        Forward reads it and writes the normalised copy (v copied along); backward reads it and its gradient and
        writes the input gradient (the weights' per-program partial sums are a few KiB). Memory-bound passes at
        the elementwise bandwidth, one launch each."""
        m, t, prof = self.m, self.lay.tp, self.prof
        if not m.qk_norm:
            return 0.0, 0.0
        qkv_bytes = BF16 * tokens * (m.q_width + 2 * m.kv_width) / t
        return prof.memory_bound_s(2 * qkv_bytes), prof.memory_bound_s(3 * qkv_bytes)

    def _layer(self) -> LayerCosts:
        m, lay, prof = self.m, self.lay, self.prof
        t, h, f = lay.tp, m.hidden, m.ffn_hidden
        T = int(self.tokens)
        qkv_n = (m.q_width + 2 * m.kv_width) // t
        gemms = self.layer_gemms()
        fwd = bwd = 0.0
        for shape in gemms:
            a, b = self._gemm_fwd_bwd_s(*shape, fp8=lay.fp8)
            fwd, bwd = fwd + a, bwd + b
        # attention core: this rank's heads over its share of the sequence (the ring covers the rest)
        s = self.shape.seq_len
        ring = prof.eff("ring") if lay.cp > 1 else 1.0  # calibrated: the ring's blocks and merges
        attn_f = ring * prof.attention_s(lay.micro_batch, m.num_heads // t, s // lay.cp, s, m.head_dim, m.causal, False)
        attn_b = ring * prof.attention_s(lay.micro_batch, m.num_heads // t, s // lay.cp, s, m.head_dim, m.causal, True)
        # elementwise kernels, each at the bandwidth the profiler measured for the runtime's own kernel
        # (bytes as the profiler counts them): the norms with the residual adds fused in (runtime/norm.py;
        # pre-norm: the attention norm alone, the MLP norm with the add before it, the layer's last add on
        # its own; every norm backward merges the residual's gradient), the MLP activation, rotary on q and k
        tok_t = T / t
        norm = "layernorm" if m.has_bias else "rmsnorm"
        act = "swiglu" if m.gated_mlp else "gelu"
        act_rows = T / t * f * (m.top_k if m.is_moe else 1)
        k = prof.kernel_s
        row_bytes = BF16 * tok_t * h
        if m.family == "bert":  # post-norm: both norms take their add; backward adds the residual's gradient apart
            ew_f = 2 * k(f"{norm}_add_fwd", 4 * row_bytes)
            ew_b = 2 * k(f"{norm}_bwd", 3 * row_bytes) + 2 * k("residual_add", 3 * row_bytes)
        else:
            ew_f = k(f"{norm}_fwd", 2 * row_bytes) + k(f"{norm}_add_fwd", 4 * row_bytes) \
                + k("residual_add", 3 * row_bytes)
            ew_b = 2 * k(f"{norm}_bwd", 4 * row_bytes)
        # GELU with a bias (dense GPT, BERT): the bias add and its gradient inside the activation's kernels
        # (runtime/bias_gelu.py); priced at plain GELU's rate by a profile measured before those kernels
        bias_act = not m.gated_mlp and m.has_bias and not m.is_moe
        act_k = "bias_gelu" if bias_act else act
        ew_f += k(f"{act_k}_fwd", BF16 * (3 if m.gated_mlp else 2) * act_rows, fallback=f"{act}_fwd")
        ew_b += k(f"{act_k}_bwd", BF16 * (5 if m.gated_mlp else 3) * act_rows, fallback=f"{act}_bwd")
        if not m.learned_positions:
            # runtime/rotary.py: one pass each way over the whole qkv GEMM output (v is copied out beside the
            # rotated q and k; backward also assembles the qkv gradient)
            rot_bytes = BF16 * 2 * T * (m.q_width + 2 * m.kv_width) / t
            ew_f += k("rotary_fwd", rot_bytes)
            ew_b += k("rotary_bwd", rot_bytes)
        qk_norm_fwd_s, qk_norm_bwd_s = self._qk_norm_s(T)
        ew_f += qk_norm_fwd_s
        ew_b += qk_norm_bwd_s
        # bias gradients: dY summed over its rows (runtime/parallel/tensor.py), column-parallel over all T
        # tokens of the local columns, row-parallel over this rank's sequence shard of all columns
        # (session 4's trace of a GPT 1.3B step: 3.6 ms of 128 ms in these sums)
        # qkv, proj (GPT, BERT; Llama-style per qkv_bias / attn_out_bias), fc1 (unless inside the activation's
        # backward), fc2
        sums = ([T * qkv_n] if m.has_qkv_bias else []) + ([tok_t * h] if m.has_attn_out_bias else [])
        if m.has_bias and not m.is_moe:
            sums += ([] if bias_act else [T * (f // t)]) + [tok_t * h]
        ew_b += sum(k("bias_grad", BF16 * rows_x_cols) for rows_x_cols in sums)
        ew_sel = 2 * k(f"{norm}_fwd", BF16 * 2 * tok_t * h) + k(f"{act_k}_fwd", BF16 * (3 if m.gated_mlp else 2) * act_rows,
                                                                 fallback=f"{act}_fwd") \
            + qk_norm_fwd_s  # inside the checkpointed attention core
        comm = {"tp": 0.0, "cp": 0.0, "ep": 0.0}
        moe_f = moe_b = 0.0
        if m.is_moe:
            routed = tok_t * m.top_k  # token copies per rank after dispatch (on average, whatever the EP degree)
            chunks = self.dispatch_chunks  # the experts run once per chunk, on its share of the rows
            rf, rb = self._gemm_fwd_bwd_s(int(tok_t), m.num_experts, h)
            # the local experts run as grouped GEMMs (runtime/parallel/expert.py: one torch._grouped_mm per
            # projection for all of them), priced as one GEMM over all the routed rows: the kernel tiles every
            # expert's rows in one launch, so it runs close to a dense GEMM of that many rows (the partial last
            # tile of each expert is not counted)
            e1f, e1b = (chunks * t for t in self._gemm_fwd_bwd_s(int(routed / chunks), (2 if m.gated_mlp else 1) * f, h))
            e2f, e2b = (chunks * t for t in self._gemm_fwd_bwd_s(int(routed / chunks), h, f))
            # the grouped GEMMs take the local experts' weights as one [experts, out, in] tensor: a view of the
            # flat parameter buffer, where runtime/parallel/data.py lays each projection's expert weights out back
            # to back (sharding 'none' and 'optimizer'); else (ZeRO-2 may cut them, FSDP owns its own storage)
            # _GroupedLinear stacks a copy in forward and again in backward: a read and a write of every local
            # expert weight (bf16) each way, per micro-batch
            stack_s = prof.memory_bound_s(2 * BF16 * mem.layer_expert_params_local(m, lay.ep)) \
                if self.stacks_expert_weights else 0.0
            rows_f_s, rows_b_s = self._moe_row_passes_s(tok_t, routed, h, lay.ep > 1)
            # the weight-gradient GEMMs priced above as one dense GEMM write one [out, in] gradient; the grouped one
            # writes one per local expert, each read and written back in fp32 where it accumulates into main_grad
            # (runtime/grouped_wgrad.py), after its tile's main loop
            grads_out = (m.num_experts // lay.ep - 1) * mem.layer_expert_params_local(m, lay.ep) / (m.num_experts // lay.ep)
            wgrad_out_s = prof.memory_bound_s(2 * mem.grad_bytes(lay) * grads_out)
            moe_f = (rf + e1f + e2f + stack_s + rows_f_s) * prof.eff("expert")
            moe_b = (rb + e1b + e2b + stack_s + rows_b_s + wgrad_out_s) * prof.eff("expert")
            # dispatch and combine all-to-alls, each way in forward and again in backward
            a2a = self.group_collective_s("all_to_all", BF16 * routed * h / chunks, lay.ep,
                                          self.strides["ep"]) * prof.eff("ep")
            if chunks == 1:
                comm["ep"] = 4 * exposed_s(a2a, (moe_f + moe_b) / 4, prof.overlap_hidden_fraction.get("ep", 0.0), True)
            else:  # each chunk's transfers beside the other chunk's experts: the schedule's own timeline
                experts_f, experts_b = (e1f + e2f) / chunks * prof.eff("expert"), (e1b + e2b) / chunks * prof.eff("expert")
                comm["ep"] = two_chunk_exposed_s(a2a, experts_f) + two_chunk_exposed_s(a2a, experts_b)
        if m.shared_expert_ffn:
            # shared experts (runtime/parallel/expert.py, SharedExperts): a bf16 SwiGLU MLP over this rank's
            # sequence shard, whole on every TP rank; Qwen's gate is a [hidden] dot product and a scaling pass.
            # The runtime runs them while the dispatch is in flight; no overlap is credited (not measured)
            fs = m.shared_expert_ffn
            for shape in ((int(tok_t), 2 * fs, h), (int(tok_t), h, fs)):
                a_s, b_s = self._gemm_fwd_bwd_s(*shape)
                fwd, bwd = fwd + a_s, bwd + b_s
            ew_f += k("swiglu_fwd", BF16 * 3 * tok_t * fs)
            ew_b += k("swiglu_bwd", BF16 * 5 * tok_t * fs)
            if m.shared_expert_gate:
                ew_f += prof.memory_bound_s(BF16 * 3 * tok_t * h)
                ew_b += prof.memory_bound_s(BF16 * 5 * tok_t * h)
        ce = prof.eff("compute")  # calibrated: what the runtime spends beyond its measured kernels
        fwd, bwd, attn_f, attn_b, ew_f, ew_b, ew_sel = (x * ce for x in (fwd, bwd, attn_f, attn_b, ew_f, ew_b, ew_sel))
        compute_f = fwd + attn_f + ew_f + moe_f
        compute_b = bwd + attn_b + ew_b + moe_b
        # tensor parallel (sequence parallel): forward all-gathers before QKV and FC1, reduce-scatters after
        # out-proj and FC2; backward mirrors them and re-gathers the saved sharded inputs for wgrad
        if t > 1:
            nbytes = BF16 * T * h
            ag = self.group_collective_s("all_gather", nbytes, t, 1) * prof.eff("tp")
            rs = self.group_collective_s("reduce_scatter", nbytes, t, 1) * prof.eff("tp")
            n_pairs = 1 if m.is_moe else 2
            frac = prof.overlap_hidden_fraction.get("tp", 0.0)
            tp_f = n_pairs * (ag + rs)
            tp_b = n_pairs * (2 * ag + rs)
            comm_tp_f = exposed_s(tp_f, fwd, frac, lay.overlap_tp)
            comm_tp_b = exposed_s(tp_b, bwd, frac, lay.overlap_tp)
        else:
            comm_tp_f = comm_tp_b = 0.0
        # context parallel: cp-1 ring steps pass K and V forward; backward passes K, V and dK, dV
        if lay.cp > 1:
            kv_bytes = BF16 * 2 * lay.micro_batch * (m.num_kv_heads // t) * (s // lay.cp) * m.head_dim
            step = self.group_collective_s("send_recv", kv_bytes, lay.cp, self.strides["cp"]) * prof.eff("cp")
            frac = prof.overlap_hidden_fraction.get("cp", 0.0)
            cp_f = exposed_s((lay.cp - 1) * step, attn_f, frac, True)
            cp_b = exposed_s(2 * (lay.cp - 1) * step, attn_b, frac, True)
        else:
            cp_f = cp_b = 0.0
        comm["tp"], comm["cp"] = comm_tp_f + comm_tp_b, cp_f + cp_b
        ep_half = comm["ep"] / 2
        sel = ew_sel + attn_f  # selective recompute reruns the norms, the MLP activation and the attention core
        return LayerCosts(fwd_compute_s=compute_f, bwd_compute_s=compute_b,
                          fwd_comm_s=comm_tp_f + cp_f + ep_half, bwd_comm_s=comm_tp_b + cp_b + ep_half,
                          selective_recompute_s=sel, comm_by_dim_s=comm)

    # -- ends -------------------------------------------------------------------------------------------
    @cached_property
    def ends(self) -> EndCosts:
        return self._memo("ends", self._ends)

    def _ends(self) -> EndCosts:
        m, lay, prof = self.m, self.lay, self.prof
        t, h, v = lay.tp, m.hidden, m.vocab_size
        T = int(self.tokens)
        # embedding: gather rows forward, scatter-add fp32 gradient backward (memory-bound)
        emb = prof.kernel_s("embedding_fwd", BF16 * T * h * 2) + prof.memory_bound_s(FP32 * T * h * 3)
        hf, hb = self._gemm_fwd_bwd_s(T, v // t, h)
        if m.family == "bert":
            a, b = self._gemm_fwd_bwd_s(T, h, h)
            hf, hb = hf + a, hb + b
        ce = prof.kernel_s("cross_entropy_fwd_bwd", 2 * BF16 * T * v / t)  # the profiler's nominal bytes per logit
        comm = 0.0
        if t > 1:
            nbytes = BF16 * T * h
            comm = 2 * (self.group_collective_s("all_gather", nbytes, t, 1)
                        + self.group_collective_s("reduce_scatter", nbytes, t, 1))
            comm += self.group_collective_s("all_reduce", FP32 * T, t, 1)  # the loss: max
            comm += self.group_collective_s("all_reduce", 2 * FP32 * T, t, 1)  # sum of exp and target logit
        c = prof.eff("compute")
        return EndCosts(embedding_s=emb * c, head_s=(hf + hb + ce) * c, head_comm_s=comm * prof.eff("tp"))

    @cached_property
    def p2p_s(self) -> float:
        """One hop of the pipeline: from the end of a virtual stage's forward (backward) on one rank to the
        start of the next (previous) stage's on another, for one micro-batch: the activation's transfer
        (profile) times the calibrated 'pp' factor, which also carries the synchronisation around the
        runtime's per-tick batched sends. The schedule play (planner/schedule.py) decides which hops wait.
        With overlap_pp off the sends are not posted ahead, so the sender waits for its transfer too."""
        if self.lay.pp == 1:
            return 0.0
        nbytes = BF16 * self.tokens * self.m.hidden / self.lay.tp
        hop = self.group_collective_s("send_recv", nbytes, 2, self.strides["pp"]) * self.prof.eff("pp")
        return hop if self.lay.overlap_pp else 2 * hop

    # -- per rank -------------------------------------------------------------------------------------
    def stage_time_s(self, j: int, st: StagePlan) -> float:
        """Forward + backward of one micro-batch through virtual stage j, recompute included: the GPU's
        time, or the host's when issuing the kernels takes longer (stage_host_s), plus the host time that
        MoE layers under expert parallelism cannot hide (stage_expert_host_s)."""
        host = self.stage_host_s(j, st)
        expert = self.stage_expert_host_s(st)
        return max(self.stage_gpu_s(j, st), host - expert) + expert

    def stage_expert_host_s(self, st: StagePlan) -> float:
        """The part of stage_host_s that adds to the GPU time instead of running under it: at EP > 1 routing
        synchronises the host with the GPU every MoE layer (runtime/parallel/expert.py reads the all-to-all
        split sizes with one .tolist()), so the MoE layer's host time (profile.host.moe_layer_s) comes after
        the GPU has caught up. At EP1 the grouped experts keep their counts on the device:
        no synchronisation, the host time is a floor like a dense layer's, and this is 0."""
        host, m, lay = self.prof.host, self.m, self.lay
        if host is None or not m.is_moe or lay.ep == 1:
            return 0.0
        return st.layers * (host.moe_layer_s() + self.extra_chunk_host_s) * self.prof.eff("host")

    def stage_gpu_s(self, j: int, st: StagePlan) -> float:
        L = self.layer
        t = st.layers * L.fwd_bwd_s + st.full_recompute_layers * L.full_recompute_s \
            + st.selective_recompute_layers * L.selective_recompute_s
        if j == 0:
            t += self.ends.embedding_s
        if j == self.lay.pp * self.lay.vpp - 1:
            t += self.ends.head_s + self.ends.head_comm_s
        return t

    def stage_fwd_share(self, j: int, st: StagePlan) -> float:
        """The forward's share of virtual stage j's GPU time (for the schedule play; recompute runs in the
        backward, and the head's forward is its output GEMM, a third of its forward + backward)."""
        L = self.layer
        fwd = st.layers * L.fwd_s + (self.ends.embedding_s if j == 0 else 0.0)
        if j == self.lay.pp * self.lay.vpp - 1:
            fwd += self.ends.head_s / 3
        gpu = self.stage_gpu_s(j, st)
        return fwd / gpu if gpu > 0 else 0.5

    @cached_property
    def host_per_layer_s(self) -> dict:
        """Host time to issue one layer, by recompute mode (profile.host; the search asks for it per stage and split,
        so it is worked out once per layout)."""
        host, lay, m = self.prof.host, self.lay, self.m
        data_parallel = lay.dp * lay.cp > 1
        key = ("host per layer", lay.tp, lay.cp, lay.sharding, lay.ep, data_parallel, self.dispatch_chunks)
        v = self._shared.get(key)
        if v is None:
            v = self._shared[key] = {
                mode: host.layer_host_s(mode, lay.tp, lay.cp, lay.sharding, m.is_moe, lay.ep, m.family,
                                        self.prof.eff("host_tp"), self.prof.eff("host_cp"), data_parallel)
                + self.extra_chunk_host_s for mode in ("none", "selective", "full")}
        return v

    @property
    def extra_chunk_host_s(self) -> float:
        """Host time per MoE layer of a second dispatch chunk (Layout.overlap_ep): it issues its transfers and
        experts after the same synchronisation, modelled as EP's host time once more (not measured)."""
        return (self.dispatch_chunks - 1) * self.prof.host.ep_extra_s

    def stage_host_s(self, j: int, st: StagePlan) -> float:
        """Host time to issue one micro-batch through virtual stage j (profile.host; 0 without it): its
        layers, a chunk's sends and schedule under pipelining, and on the last stage the rest of the
        micro-batch (embedding, head, loss). 0 for a CUDA-graph step (Layout.cuda_graph): the host launches the
        captured step once, and that launch (tens of microseconds) is left out."""
        host = self.prof.host
        if host is None or self.lay.cuda_graph:
            return 0.0
        lay, m = self.lay, self.m
        per_layer = self.host_per_layer_s
        none = st.layers - st.full_recompute_layers - st.selective_recompute_layers
        t = none * per_layer["none"] + st.full_recompute_layers * per_layer["full"] \
            + st.selective_recompute_layers * per_layer["selective"]
        if j == lay.pp * lay.vpp - 1:
            t += host.micro_batch_ends_s(m.family, lay.dp * lay.cp > 1)
        return (t + (host.pp_chunk_s if lay.pp > 1 else 0.0)) * self.prof.eff("host")

    @cached_property
    def per_layer_params(self) -> tuple[float, float]:
        """(dense, expert) parameter elements of one layer on one rank."""
        return self._memo("per_layer_params", lambda: (mem.layer_dense_params_local(self.m, self.lay.tp),
                                                       mem.layer_expert_params_local(self.m, self.lay.ep)))

    def rank_params(self, rank_stages: list[tuple[int, StagePlan]]) -> tuple[float, float]:
        """(dense, expert) parameter elements held by one pipeline rank."""
        layers = sum(st.layers for _, st in rank_stages)
        first = any(j == 0 for j, _ in rank_stages)
        last = any(j == self.lay.pp * self.lay.vpp - 1 for j, _ in rank_stages)
        return self.params_of(layers, first, last)

    def params_of(self, layers: float, first: bool, last: bool) -> tuple[float, float]:
        m, lay = self.m, self.lay
        dense_l, expert_l = self.per_layer_params
        dense = layers * dense_l
        if first:
            dense += mem.embedding_params_local(m, lay.tp)
        if last:
            dense += mem.head_params_local(m, lay.tp, lay.pp)
        return dense, layers * expert_l

    def rank_memory_bytes(self, rank: int, rank_stages: list[tuple[int, StagePlan]], num_micro: int) -> float:
        """Peak bytes of one pipeline rank: states + every in-flight micro-batch's activations + the largest
        transient (a layer's backward working set, the output layer's logits, a fully recomputed layer's
        rematerialised activations). Under 'optimizer+grads' the in-flight full-size gradient buckets sit beside
        the activations during every backward, so they add to this peak. (Until session 11 ZeRO-1 had a second,
        end-of-backward peak: its reduce-scatter outputs, one per bucket, held until the step; it now reduces in
        place, memory.dp_reduction_transient_bytes.)"""
        m, lay, shape = self.m, self.lay, self.shape
        dense, expert = self.rank_params(rank_stages)
        first = any(j == 0 for j, _ in rank_stages)
        last = any(j == lay.pp * lay.vpp - 1 for j, _ in rank_stages)
        root = (mem.embedding_params_local(m, lay.tp) if first else 0.0) \
            + (mem.head_params_local(m, lay.tp, lay.pp) if last else 0.0)
        base = mem.state_bytes(dense, expert, lay) + mem.fsdp_gather_bytes(m, lay, root) \
            + mem.cublas_workspace_bytes(lay, self.cluster.gpu)
        acts = self.activations
        last = lay.pp * lay.vpp - 1
        dp_t = mem.dp_reduction_transient_bytes(dense, expert, lay, mem.largest_layer_param_local(m, lay.tp),
                                                mem.largest_param_local(m, lay.tp))
        beside = dp_t  # ZeRO-2's buckets alive beside the activations (nothing under the other levels)
        transient = acts.working_bytes + beside
        total = base
        for chunk, (j, st) in enumerate(rank_stages):
            inflight = mem.in_flight_micro_batches(rank, chunk, lay, num_micro)
            n_none = st.layers - st.full_recompute_layers - st.selective_recompute_layers
            per_mb = n_none * acts.none_bytes + st.selective_recompute_layers * acts.selective_bytes \
                + st.full_recompute_layers * acts.full_bytes
            per_mb += mem.rotary_table_bytes(m, shape, lay)
            if j != last:
                per_mb += mem.pipeline_output_bytes(m, shape, lay)
            if j == 0:
                per_mb += mem.embedding_activation_bytes(m, shape, lay)
            if j == last:
                kept, trans = mem.head_activation_bytes(m, shape, lay)
                per_mb += kept
                transient = max(transient, trans)
            if st.full_recompute_layers:
                transient = max(transient, acts.working_bytes + acts.none_bytes + beside)
            total += inflight * per_mb
        return total + transient

    def memory_lower_bound_bytes(self, per_layer_act_bytes: float, extra_transient_bytes: float = 0.0) -> float:
        """A lower bound of the busiest rank's rank_memory_bytes over every layer split, with each layer keeping at
        least per_layer_act_bytes per micro-batch in flight (the least its recompute choices allow). Each rank r
        holds fixed bytes F_r that no split moves (workspace, the smallest transient, its chunks' per-micro-batch
        tensors, the embedding or head where it sits), and per layer w_r = state + activations times the fewest
        micro-batches any of its chunks holds in flight. The continuous relaxation spreads the L layers so that
        every rank holding any reaches the same M: sum_r max(0, M - F_r) / w_r = L. extra_transient_bytes: a
        transient every rank has for the recompute assumed (a fully recomputed layer's rematerialised activations)."""
        state_l, ranks = self.rank_fixed_bytes
        fixed = [f + max(transient + extra_transient_bytes, own_transient) for f, transient, own_transient, _ in ranks]
        weight = [state_l + per_layer_act_bytes * k for _, _, _, k in ranks]
        # the smallest M: add ranks in order of F_r while M stays above the next one's F
        order = sorted(range(len(ranks)), key=fixed.__getitem__)
        inv = fixed_over_w = 0.0
        M = fixed[order[0]]
        for i, r in enumerate(order):
            inv += 1.0 / weight[r]
            fixed_over_w += fixed[r] / weight[r]
            M = (self.m.num_layers + fixed_over_w) / inv
            if i + 1 == len(order) or M <= fixed[order[i + 1]]:
                break
        return M

    @cached_property
    def rank_fixed_bytes(self) -> tuple[float, list[tuple[float, float, float, int]]]:
        """(state bytes per layer, per rank (bytes no split moves, the transient every rank has, this rank's own
        transient (the logits, on the last stage's rank), the fewest micro-batches any of its chunks holds in
        flight)) for memory_lower_bound_bytes; worked out once per layout."""
        m, lay, shape = self.m, self.lay, self.shape
        num_micro = shape.global_batch // (lay.micro_batch * lay.dp)
        S = lay.pp * lay.vpp
        state_l = mem.state_bytes(*self.per_layer_params, lay)
        transient = self.activations.working_bytes + mem.dp_reduction_transient_bytes(
            0.0, 0.0, lay, mem.largest_layer_param_local(m, lay.tp), mem.largest_param_local(m, lay.tp))
        every_mb = mem.rotary_table_bytes(m, shape, lay)
        hop_mb = mem.pipeline_output_bytes(m, shape, lay)
        head_kept, head_transient = mem.head_activation_bytes(m, shape, lay)
        workspace = mem.cublas_workspace_bytes(lay, self.cluster.gpu)
        ranks = []
        for r in range(lay.pp):
            inflight = mem.in_flight_by_chunk(r, lay, num_micro)
            first, last = r == 0, r == lay.pp - 1  # stage 0 is rank 0's chunk 0; the last stage rank pp-1's last
            dense, expert = self.params_of(0, first, last)
            f = mem.state_bytes(dense, expert, lay) + mem.fsdp_gather_bytes(m, lay, dense) + workspace
            for c, k in enumerate(inflight):
                j = c * lay.pp + r
                per_mb = every_mb + (hop_mb if j != S - 1 else head_kept)
                if j == 0:
                    per_mb += mem.embedding_activation_bytes(m, shape, lay)
                f += k * per_mb
            ranks.append((f, transient, head_transient if last else 0.0, min(inflight)))
        return state_l, ranks

    def memory_terms(self, rank: int, num_micro: int) -> "MemoryTerms":
        """Rank memory as linear functions of its stages' layer and recompute counts (what CP-SAT and the
        greedy split use): the activation peak, base + sum_c (state + k_c * a_none) * n_c
        - k_c * (d_full * f_c + d_sel * s_c) + a_none if any layer is fully recomputed (its rematerialised
        activations during backward) (see rank_memory_bytes)."""
        lay = self.lay
        js = list(range(rank, lay.pp * lay.vpp, lay.pp))
        acts = self.activations
        dense_l, expert_l = self.per_layer_params
        act_base = self.rank_memory_bytes(rank, [(j, StagePlan(0)) for j in js], num_micro)
        state_l = mem.state_bytes(dense_l, expert_l, lay)
        return MemoryTerms(
            base_bytes=act_base, state_per_layer_bytes=state_l,
            in_flight=list(mem.in_flight_by_chunk(rank, lay, num_micro)),
            none_bytes=acts.none_bytes, sel_saving_bytes=acts.none_bytes - acts.selective_bytes,
            full_saving_bytes=acts.none_bytes - acts.full_bytes)

    # -- per step -----------------------------------------------------------------------------------------
    def dp_comm_s(self, dense: float, expert: float, window_fwd_s: float, window_bwd_s: float, num_micro: int) -> float:
        """Exposed data-parallel traffic of one rank per step."""
        lay, frac = self.lay, self.prof.overlap_hidden_fraction.get("dp", 0.0)
        d = lay.dp * lay.cp
        total = 0.0
        # the dense gradients are sharded over the dp x cp ranks (adjacent blocks spaced by tp); the expert
        # gradients over the ranks holding the same experts (every ep-th of those)
        grad = mem.grad_bytes(lay)  # the reduction runs in the gradients' precision
        for params, group, stride in ((dense, d, lay.tp), (expert, d // lay.ep, lay.tp * lay.ep)):
            if group <= 1 or params <= 0:
                continue
            rs = self.group_collective_s("reduce_scatter", grad * params, group, stride) * self.prof.eff("dp")
            ag = self.group_collective_s("all_gather", BF16 * params, group, stride) * self.prof.eff("dp")
            if lay.sharding == "none":
                ar = self.group_collective_s("all_reduce", grad * params, group, stride) * self.prof.eff("dp")
                total += exposed_s(ar, window_bwd_s, frac, lay.overlap_dp)
            elif lay.sharding == "optimizer":
                total += exposed_s(rs, window_bwd_s, frac, lay.overlap_dp) + exposed_s(ag, window_fwd_s, frac, lay.overlap_dp)
            elif lay.sharding == "optimizer+grads":
                total += num_micro * exposed_s(rs, window_bwd_s, frac, lay.overlap_dp) \
                    + exposed_s(ag, window_fwd_s, frac, lay.overlap_dp)
            else:  # full: gather for forward and again for backward, reduce-scatter, every micro-batch
                total += num_micro * (exposed_s(ag, window_fwd_s, frac, lay.overlap_dp)
                                      + exposed_s(ag + rs, window_bwd_s, frac, lay.overlap_dp))
        return total

    def _moe_row_passes_s(self, tokens: float, routed: float, h: int, regroup: bool) -> tuple[float, float]:
        """(forward, backward) seconds of the MoE layer's row movements over [rows, hidden] bf16, as
        runtime/parallel/expert.py and runtime/moe_rows.py issue them, at the memory-bound rate: forward the
        dispatch gather (reads and writes every routed row) and the weighted combine (reads the routed rows,
        writes the tokens); backward the combine's (reads the tokens' gradient per routed row and the routed
        rows, writes their gradient) and the gather's (sums each token's k copies). Under EP the received rows
        are regrouped by expert and back: one more gather each way, in forward and in backward."""
        row = BF16 * h
        fwd = row * (2 * routed + routed + tokens)
        bwd = row * (3 * routed + routed + tokens)
        if regroup:
            fwd += row * 4 * routed
            bwd += row * 4 * routed
        return self.prof.memory_bound_s(fwd), self.prof.memory_bound_s(bwd)

    def fused_wgrad_params(self, layers: float, last: bool, first: bool = False) -> float:
        """Weights whose gradient goes into the fp32 main gradient without a bf16 gradient and a separate add:
        the GEMM weights (the weight-gradient GEMM accumulates in fp32 itself) and the word embedding (its
        backward index-adds rows into fp32, runtime/parallel/tensor.py _EmbeddingLookup), as the runtime does
        when a full fp32 main-gradient buffer exists (sharding 'none' and 'optimizer'). Norm weights and biases
        go there directly too; they are too small to count here."""
        lay, m = self.lay, self.m
        if lay.sharding not in ("none", "optimizer"):
            return 0.0
        word = m.vocab_size * m.hidden / lay.tp
        tied_copy = last and m.tie_embeddings and lay.pp > 1  # the last stage's own copy of the tied weight
        # MoE experts on Hopper: their grouped weight-gradient GEMM accumulates into main_grad itself
        # (runtime/grouped_wgrad.py); elsewhere their gradients are added per micro-batch
        experts = mem.layer_expert_params_local(m, lay.ep) if m.is_moe and self.cluster.gpu in GROUPED_GEMM_GPUS else 0.0
        return layers * (mem.layer_gemm_weights_local(m, lay.tp) + experts) \
            + (mem.head_gemm_weights_local(m, lay.tp) if last else 0.0) \
            + (word if first else 0.0) + (word if tied_copy else 0.0)

    def tp_grad_reduce_s(self, layers: float, first: bool, last: bool, num_micro: int) -> float:
        """The TP all-reduces of the gradients of TP-replicated parameters (memory.tp_replicated_tensors), one
        fp32 call per tensor, issued in backward's gradient hooks on the compute stream: exposed. Once per step
        (on the last micro-batch), every micro-batch under 'optimizer+grads' (whose gradients are reduced every
        micro-batch); under 'full' on the rank's shard of each. Under MoE with TP the experts' weights are among
        them: 2 GiB per step for moe-small at TP2 (11 ms), which the planner had not priced (session 10: a
        helper's re-prediction of session 9's n4 TP2 runs)."""
        lay = self.lay
        if lay.tp == 1:
            return 0.0
        shard = lay.dp * lay.cp if lay.sharding == "full" else 1
        calls = num_micro if lay.sharding == "optimizer+grads" else 1
        grad = mem.grad_bytes(lay)
        t = sum(n * self.group_collective_s("all_reduce", grad * elems / shard, lay.tp, self.strides["tp"])
                for n, elems in mem.tp_replicated_tensors(self.m, lay.ep, layers, first, last))
        return calls * t * self.prof.eff("tp")

    def optimizer_s(self, dense: float, expert: float, fused: float = 0.0) -> float:
        """AdamW over the local master shard, plus the runtime's per-parameter bookkeeping around it
        (`fused`: the rank's GEMM weights with gradient-accumulation fusion, see fused_wgrad_params)."""
        lay = self.lay
        d = lay.dp * lay.cp if lay.sharding != "none" else 1
        de = max(d // lay.ep, 1) if lay.sharding != "none" else 1
        shard = dense / d + expert / de
        num_micro = self.shape.global_batch // (lay.micro_batch * lay.dp)
        return (shard * self.prof.optimizer_s_per_param * ADAMW_GRAD_SCALE[lay.grad_dtype]
                + self.param_bookkeeping_s(dense + expert, shard, num_micro, fused)) * self.prof.eff("optimizer")

    def param_bookkeeping_s(self, local: float, shard: float, num_micro: int, fused: float = 0.0) -> float:
        """Memory traffic the runtime's mixed precision adds per step (counted from runtime/parallel/data.py):
        every micro-batch each bf16 gradient is added into its fp32 main gradient (read 2 + 4, write 4 B; with
        bf16 main gradients (Layout.grad_dtype) every fp32 figure here is 2 B),
        except the `fused` GEMM weights whose weight-gradient GEMM accumulates into the fp32 main gradient
        itself (that cost is in the profiled wgrad GEMM times); once per step the main gradients are zeroed
        (4 B); over the local shard the gradient norm is read (4 B), except without a data-parallel group,
        where the runtime takes each bucket's norm beside the rest of backward (runtime/parallel/data.py).
        Clipping and the cast of the updated master weights to bf16 are inside the profiled AdamW step. The
        accumulation at the measured rate of that mixed-precision add ('grad_accumulate'), the rest at the
        rate of a residual add (a pure streaming kernel)."""
        lay = self.lay
        g = mem.grad_bytes(lay)  # bf16 gradients: read 2 + 2, write 2 B; zero and norm 2 B
        norm_beside_backward = lay.dp * lay.cp == 1 and lay.overlap_dp and lay.sharding != "full"
        accumulate = (local - fused) * (BF16 + 2 * g) * num_micro
        rest = local * g + (0.0 if norm_beside_backward else shard * g)
        accumulate_kernel = "grad_accumulate" if g == FP32 else "residual_add"  # bf16 into bf16: a plain add
        return self.prof.kernel_s(accumulate_kernel, accumulate) + self.prof.kernel_s("residual_add", rest)

    def predict(self, stages: list[StagePlan], play: bool = True) -> Prediction:
        """The plan's step time, memory and breakdown. play=False times a pipeline by the schedule's closed
        form (planner/schedule.py, closed_form_s) with every hop on the path, instead of playing the schedule:
        the search scores its candidates that way (a play costs milliseconds) and plays the plans it keeps."""
        lay, m = self.lay, self.m
        num_micro = self.shape.global_batch // (lay.micro_batch * lay.dp)
        per_rank_t, mems, dp_t, opt_t, tpg_t = [], [], [], [], []
        times = [self.stage_time_s(j, st) for j, st in enumerate(stages)]
        for r in range(lay.pp):
            rs = [(j, stages[j]) for j in range(len(stages)) if j % lay.pp == r]
            t_r = sum(times[j] for j, _ in rs)
            per_rank_t.append(t_r)
            mems.append(self.rank_memory_bytes(r, rs, num_micro))
            dense, expert = self.rank_params(rs)
            L = self.layer
            layers = sum(st.layers for _, st in rs)
            dp_t.append(self.dp_comm_s(dense, expert, layers * L.fwd_s, layers * (L.bwd_compute_s + L.bwd_comm_s), num_micro))
            last = any(j == lay.pp * lay.vpp - 1 for j, _ in rs)
            first = any(j == 0 for j, _ in rs)
            opt_t.append(self.optimizer_s(dense, expert, self.fused_wgrad_params(layers, last, first)))
            tpg_t.append(self.tp_grad_reduce_s(layers, first, last, num_micro))
        t_max = max(per_rank_t)
        if lay.pp == 1:
            pipe = ideal = num_micro * t_max
        else:
            ideal = closed_form_s(per_rank_t, num_micro, lay.vpp)  # equal chunks, free hops
            if not play:
                pipe = closed_form_s([t + 2 * lay.vpp * self.p2p_s for t in per_rank_t], num_micro, lay.vpp)
            else:  # the runtime's schedule, played with these stages' times (planner/schedule.py)
                fwd = [t * self.stage_fwd_share(j, st) for j, (t, st) in enumerate(zip(times, stages))]
                bwd = [t - f for t, f in zip(times, fwd)]
                pipe = pipeline_time_s(lay.pp, lay.vpp, num_micro, fwd, bwd, self.p2p_s)
        # after the pipeline: the data-parallel reduction left exposed and the TP reduction of replicated
        # parameters' gradients (both in the last backward's hooks), then the optimizer
        ends_t = [d + g for d, g in zip(dp_t, tpg_t)]
        step = pipe + max(ends_t) + max(opt_t)
        # breakdown along the slowest rank
        r = per_rank_t.index(t_max)
        rs = [(j, stages[j]) for j in range(len(stages)) if j % lay.pp == r]
        L = self.layer
        layers = sum(st.layers for _, st in rs)
        recompute = sum(st.full_recompute_layers * L.full_recompute_s + st.selective_recompute_layers * L.selective_recompute_s
                        for _, st in rs)
        ends = sum((self.ends.embedding_s if j == 0 else 0.0)
                   + (self.ends.head_s if j == len(stages) - 1 else 0.0) for j, _ in rs)
        head_comm = sum(self.ends.head_comm_s for j, _ in rs if j == len(stages) - 1)
        host_bound = num_micro * sum(self.stage_time_s(j, st) - self.stage_gpu_s(j, st) for j, st in rs)
        breakdown = {
            "compute": num_micro * (layers * (L.fwd_compute_s + L.bwd_compute_s) + ends),
            "host": host_bound,
            "recompute": num_micro * recompute,
            "tp_comm": num_micro * (layers * L.comm_by_dim_s["tp"] + head_comm) + max(ends_t) - max(dp_t),
            "cp_comm": num_micro * layers * L.comm_by_dim_s["cp"],
            "ep_comm": num_micro * layers * L.comm_by_dim_s["ep"],
            # what the schedule adds beyond its closed form: hops waited for, and uneven chunks' fill and drain
            "pp_comm": max(0.0, pipe - ideal),
            "bubble": min(pipe, ideal) - num_micro * t_max,
            "dp_comm": max(dp_t),
            "optimizer": max(opt_t),
        }
        tokens = self.shape.global_batch * self.shape.seq_len
        flops = m.model_flops_per_token(self.shape.seq_len) * tokens
        n = lay.world_size
        kind = self.cluster.kind
        return Prediction(step_s=step, tokens_per_s=tokens / step, tflops_per_gpu=flops / step / n / 1e12,
                          mfu=flops / step / n / (kind.peak_bf16_tflops * 1e12),
                          memory_gib_per_rank=[b / mem.GIB for b in mems],
                          memory_limit_gib=mem.memory_limit_bytes(self.cluster.usable_memory_gib) / mem.GIB,
                          breakdown_s=breakdown)


def evaluate(plan: Plan, cluster: ClusterSpec, profile: Profile) -> Prediction:
    return CostModel(plan.model, plan.training, plan.layout, cluster, profile).predict(plan.stages)
