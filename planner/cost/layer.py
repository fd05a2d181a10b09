"""Per layer and micro-batch on one rank: GEMMs, attention and elementwise kernels, with the tensor-, context- and
expert-parallel communication beside them (LayerCosts), and the embedding and output ends (EndCosts); the MoE
layer's routed experts and their all-to-alls in planner/cost/moe_layer.py."""
from __future__ import annotations

from planner import memory as mem
from planner.cost.eager_ops import eager_llama_elementwise_s
from planner.cost.moe_layer import MoeCosts, MoeTerms
from planner.cost.terms import BF16, FP32, EndCosts, LayerCosts, cached_property, ep_beside_layer_exposed_s, exposed_s


UNFUSED_CORE_FWD_BYTES = 3 + 5
"""Memory-bound bytes per attention score of an unfused core's forward (LayerTerms._unfused_attention_s): Megatron's
causal softmax reads the lower triangle (1 of 2 bytes on average) and writes the whole row (2); dropout reads the
probabilities (2) and writes its output (2) and mask (1)."""
UNFUSED_CORE_BWD_BYTES = 5 + 4
"""The same for its backward: dropout's backward reads the gradient (2) and the mask (1) and writes the gradient (2);
the softmax's reads the gradient and its output over the lower triangle (2) and writes the whole gradient (2)."""


def torch_cp_fp32_pass_bytes(out_elems: float, kv_elems: float, cp: int) -> tuple[float, float]:
    """Bytes (forward, backward) of the memory-bound passes PyTorch's context_parallel (torch 2.6,
    torch/distributed/tensor/experimental/_attention.py, load balancing on) runs around its cp attention blocks on
    one rank, per layer and micro-batch (RuntimeTarget.cp_fp32_buffers). out_elems: the attention output's elements
    (the query heads'); kv_elems: K's (or V's) as exchanged. Of the cp - 1 blocks beside the local one, half take
    half the queries on average, so a block's output is 3/4 of the whole one.
    Forward: each block's output cast to fp32 (6 B per element), merged into the running fp32 output by three fp32
    passes (out - block, times the sigmoid of the log-sum-exp difference, subtract: 32 B), the half-query blocks'
    result spliced back into the whole output by a cat (8 B), the final cast to bf16 (6 B); K and V made contiguous
    (4 B each) and concatenated for the rotater at every step but the last (4 B each).
    Backward: fp32 dQ, dK, dV zero-filled (4 B); each block's dQ added into the fp32 one (10 B; the half-query
    blocks' by a cat, 8 B); each step's arriving fp32 dK, dV take the block's share (10 B) and are packed into one
    fp32 buffer for the next rank (8 B), the half-key blocks' share spliced by a cat (8 B); K and V contiguous and
    concatenated as in forward; the casts back to bf16 (6 B)."""
    n = cp
    block_share = 1 + (n - 1) * 3 / 4  # the local block whole, the others at 3/4 of the queries
    halves = (n - 1) / 2  # blocks with half the queries (forward, dQ) or half the keys (dK, dV)
    fwd = out_elems * (6 * block_share + 32 * (n - 1) * 3 / 4 + 8 * halves + 6) + 2 * kv_elems * 4 * n
    bwd = out_elems * (4 + 10 * block_share + 8 * halves + 6) \
        + 2 * kv_elems * (4 + 18 * n + 8 * halves + 4 * n + 6)
    return fwd, bwd


class LayerTerms(MoeTerms):
    """CostModel's per-layer and end costs (shared between layouts with the same layer key); the routed experts'
    come from MoeTerms (cost/moe_layer.py)."""

    @cached_property
    def activations(self) -> mem.LayerActivations:
        cache = self.target.fp8_activation_cache
        if cache is not None:
            return self._memo("activations", lambda: mem.fp8_cached_layer_activations(self.m, self.shape, self.lay,
                                                                                     cache))
        if self.target.unfused_attention:
            return self._memo("activations", lambda: mem.unfused_core_layer_activations(self.m, self.shape, self.lay))
        ring_copy = self.target.cp_output_copy and self.lay.cp > 1
        return self._memo("activations", lambda: mem.layer_activations(self.m, self.shape, self.lay, ring_copy))

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

        def g(table, *mnk):  # the profile's GEMM, as the target's runtime runs it
            return self.target.gemm_s(table, self.prof.gemm_table_s(table, *mnk))
        return g(tf, *f), g(td, *d) + g(tw, *w)

    def _gemm_queries(self, m: int, n: int, k: int, fp8: bool = False) -> list[tuple[str, int, int, int]]:
        """(profile table, m, n, k) of the forward, dgrad and wgrad GEMMs of a linear layer [m,k]x[k,n]."""
        mm = "fp8" if fp8 else "mm"
        wg = "fp8" if fp8 and self.target.fp8_wgrad else ("mm" if self.lay.grad_dtype == "bf16" else "wgrad")
        return [(mm, m, n, k), (mm, m, k, n), (wg, n, k, m)]

    @cached_property
    def layer(self) -> LayerCosts:
        return self._memo("layer", self._layer)

    def layer_gemms(self) -> list[tuple[int, int, int]]:
        """(m, n, k) of the dense layer's linear GEMMs on one rank, forward layout (qkv, out-projection, and
        without MoE fc1 and fc2); each also runs as dgrad and wgrad (_gemm_fwd_bwd_s)."""
        m, t = self.m, self.lay.tp
        T = int(self.tokens)
        gemms = [(T, self._qkv_gemm_width, m.hidden), (T, m.hidden, m.q_width // t)]
        if not m.is_moe:
            gemms += [(T, (2 if m.gated_mlp else 1) * m.ffn_hidden // t, m.hidden), (T, m.hidden, m.ffn_hidden // t)]
        return gemms

    @property
    def _gathers_qkv_output(self) -> bool:
        """Whether this layer's QKV output is all-gathered across TP (RuntimeTarget.qkv_output_gather, with fewer KV
        heads than TP ranks)."""
        return self.target.qkv_output_gather and self.m.num_kv_heads < self.lay.tp

    @property
    def _qkv_gemm_width(self) -> int:
        """Output columns of one rank's fused QKV GEMM: its query heads and the K, V of its KV heads (of the one it
        shares, computed from replicated weights, where KV heads are fewer than TP ranks), or (q + 2 kv) / TP where
        the target gathers the QKV output instead."""
        m, t = self.m, self.lay.tp
        if self._gathers_qkv_output:
            return (m.q_width + 2 * m.kv_width) // t
        return m.qkv_width_local(t)

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
        qkv_bytes = BF16 * tokens * m.qkv_width_local(t)
        return prof.memory_bound_s(2 * qkv_bytes), prof.memory_bound_s(3 * qkv_bytes)

    def _unfused_attention_s(self) -> tuple[float, float]:
        """(forward, backward) seconds of an unfused attention core on one rank (RuntimeTarget.unfused_attention),
        as Megatron-LM's model of the published runs of Narayanan et al. 2021 and Korthikanti et al. 2022 ran it
        (megatron/model/transformer.py, ParallelAttention and CoreAttention): the scores by one batched GEMM
        (torch.baddbmm) over the whole s x s square, the causal mask included; Megatron's fused causal softmax (scaled_upper_triang_masked_softmax), which reads the
        lower triangle and writes the whole row; dropout on the probabilities (--attention-dropout 0.1 by default)
        writing its output and a byte mask; the context by a second batched GEMM. Backward: the two GEMMs' four
        gradients, dropout's backward (gradient and mask in, gradient out) and the softmax's (gradient and output
        over the lower triangle in, the whole gradient out). The batched GEMMs are priced as the profile's GEMM of
        all (micro-batch x heads) rows at once, the passes at its memory-bound bandwidth: per score
        UNFUSED_CORE_FWD_BYTES forward, UNFUSED_CORE_BWD_BYTES backward."""
        m, lay, prof = self.m, self.lay, self.prof
        groups = lay.micro_batch * (m.num_heads // lay.tp)  # (sequence, head) pairs of this rank
        s_q, s_k, d = self.shape.seq_len // lay.cp, self.shape.seq_len, m.head_dim
        score_elems = mem.unfused_attention_score_elems(m, self.shape, lay)

        def g(rows, n, k):  # a batched GEMM of `groups` [rows, k] x [k, n] products, as one of all their rows
            return self.target.gemm_s("mm", prof.gemm_table_s("mm", groups * rows, n, k))
        fwd = g(s_q, s_k, d) + g(s_q, d, s_k) + prof.memory_bound_s(UNFUSED_CORE_FWD_BYTES * score_elems)
        # dP = dO V^T, dV = P^T dO, dQ = dS K, dK = dS^T Q
        bwd = g(s_q, s_k, d) + g(s_k, d, s_q) + g(s_q, d, s_k) + g(s_k, d, s_q) \
            + prof.memory_bound_s(UNFUSED_CORE_BWD_BYTES * score_elems)
        return fwd, bwd

    def _layer(self) -> LayerCosts:
        """One layer and micro-batch on this rank: its GEMMs, attention core, elementwise kernels and MoE experts,
        calibrated by the profile's efficiencies, and the communication of each parallel dimension exposed beside
        them (tensor, context and expert parallel)."""
        m, prof = self.m, self.prof
        fwd, bwd = self._dense_gemms_s()
        attn_f, attn_b = self._attention_core_s()
        ew_f, ew_b, ew_sel = self._elementwise_s()
        moe = self._moe_s() if m.is_moe else MoeCosts()
        if m.shared_expert_ffn:
            fwd, bwd, ew_f, ew_b = self._with_shared_experts_s(fwd, bwd, ew_f, ew_b)
        # calibrated: what the runtime spends beyond its measured kernels; the target's kernels against ours
        ce = self.target.kernel_s(prof.eff("compute"))
        fwd, bwd, attn_f, attn_b, ew_f, ew_b, ew_sel = (x * ce for x in (fwd, bwd, attn_f, attn_b, ew_f, ew_b, ew_sel))
        compute_f = fwd + attn_f + ew_f + moe.fwd_s
        compute_b = bwd + attn_b + ew_b + moe.bwd_s
        comm = {"tp": 0.0, "cp": 0.0, "ep": moe.comm_ep_s}
        if m.is_moe and self.dispatch_chunks == 1 and self._ep_beside_layer:
            # the target's EP A2A overlap: the transfers beside the other micro-batch's whole layer
            comm["ep"] = ep_beside_layer_exposed_s(moe.all_to_all_s, compute_f - moe.fwd_s, compute_b - moe.bwd_s,
                                                   moe.fwd_s + moe.bwd_s, moe.ep_fraction)
        comm_tp_f, comm_tp_b = self._tp_comm_s(fwd, bwd)
        cp_f, cp_b = self._cp_comm_s(attn_f, attn_b)
        comm["tp"], comm["cp"] = comm_tp_f + comm_tp_b, cp_f + cp_b
        ep_half = comm["ep"] / 2
        # selective recompute reruns the norms, the MLP activation and the attention core (runtime/model.py
        # checkpoints Attention.core), with context parallelism the core's ring passes of K and V too
        sel = ew_sel + attn_f + cp_f
        return LayerCosts(fwd_compute_s=compute_f, bwd_compute_s=compute_b,
                          fwd_comm_s=comm_tp_f + cp_f + ep_half, bwd_comm_s=comm_tp_b + cp_b + ep_half,
                          selective_recompute_s=sel, comm_by_dim_s=comm)

    def _dense_gemms_s(self) -> tuple[float, float]:
        """(forward, backward) seconds of the layer's linear GEMMs (layer_gemms), uncalibrated."""
        fwd = bwd = 0.0
        for shape in self.layer_gemms():
            a, b = self._gemm_fwd_bwd_s(*shape, fp8=self.lay.fp8)
            fwd, bwd = fwd + a, bwd + b
        return fwd, bwd

    @property
    def _cp_kv_heads(self) -> int:
        """K and V heads as context parallelism moves them (all query heads where the target expands them)."""
        return self.m.num_heads if self.target.cp_kv_expanded else self.m.num_kv_heads

    def _attention_core_s(self) -> tuple[float, float]:
        """(forward, backward) seconds of the attention core: this rank's heads over its share of the sequence (the
        ring covers the rest), fused or unfused as the target runs it, with PyTorch's fp32 passes around the context-
        parallel blocks where the target has them; uncalibrated."""
        m, lay, prof = self.m, self.lay, self.prof
        t, s = lay.tp, self.shape.seq_len
        ring = prof.eff("ring") if lay.cp > 1 else 1.0  # calibrated: the ring's blocks and merges
        if self.target.unfused_attention:
            attn_f, attn_b = (ring * x for x in self._unfused_attention_s())
        else:
            attn_f, attn_b = (ring * self.target.attention_s(
                prof.attention_s(lay.micro_batch, m.num_heads // t, s // lay.cp, s, m.head_dim, m.causal, bwd), bwd)
                for bwd in (False, True))
        if lay.cp > 1 and self.target.cp_fp32_buffers:  # PyTorch's fp32 merges and accumulators around the blocks
            per_head = lay.micro_batch * s // lay.cp * m.head_dim
            pass_f, pass_b = torch_cp_fp32_pass_bytes(m.num_heads // t * per_head,
                                                      max(self._cp_kv_heads // t, 1) * per_head,
                                                      lay.cp)
            attn_f, attn_b = attn_f + prof.memory_bound_s(pass_f), attn_b + prof.memory_bound_s(pass_b)
        return attn_f, attn_b

    def _norm_kernels_s(self, norm: str, row_bytes: float) -> tuple[float, float]:
        """(forward, backward) seconds of the layer's two norms with the residual adds fused in (runtime/norm.py).
        Pre-norm: the attention norm alone, the MLP norm with the add before it, the layer's last add on its own;
        every norm backward merges the residual's gradient. Post-norm: both norms take their add; backward adds the
        residual's gradient apart."""
        k = self.prof.kernel_s
        if self.m.model_family.post_norm:
            ew_f = 2 * k(f"{norm}_add_fwd", 4 * row_bytes)
            ew_b = 2 * k(f"{norm}_bwd", 3 * row_bytes) + 2 * k("residual_add", 3 * row_bytes)
        else:
            ew_f = k(f"{norm}_fwd", 2 * row_bytes) + k(f"{norm}_add_fwd", 4 * row_bytes) \
                + k("residual_add", 3 * row_bytes)
            ew_b = 2 * k(f"{norm}_bwd", 4 * row_bytes)
        return ew_f, ew_b

    def _elementwise_s(self) -> tuple[float, float, float]:
        """(forward, backward, selective recompute) seconds of the layer's elementwise kernels, each at the bandwidth
        the profiler measured for the runtime's own kernel (bytes as the profiler counts them): the norms
        (_norm_kernels_s), the MLP activation, rotary on q and k, Qwen3's q/k norms and the bias gradients;
        uncalibrated. A target that runs torchtitan's Llama ops eagerly prices those instead
        (RuntimeTarget.eager_llama_elementwise; planner/cost/eager_ops.py)."""
        if self.target.eager_llama_elementwise:
            return eager_llama_elementwise_s(self.m, self.lay, self.tokens, self.shape.seq_len, self.prof)
        m, lay, prof = self.m, self.lay, self.prof
        t, h, f = lay.tp, m.hidden, m.ffn_hidden
        T = int(self.tokens)
        tok_t = T / t
        norm = "layernorm" if m.layernorm else "rmsnorm"
        act = "swiglu" if m.gated_mlp else "gelu"
        act_rows = T / t * f * (m.top_k if m.is_moe else 1)
        k = prof.kernel_s
        ew_f, ew_b = self._norm_kernels_s(norm, BF16 * tok_t * h)
        # tanh GELU with a bias (dense GPT, BERT): the bias add and its gradient inside the activation's kernels
        # (runtime/bias_gelu.py); priced at plain GELU's rate by a profile without those kernels. GeGLU (Gemma):
        # one kernel each way over SwiGLU's bytes (runtime/geglu.py), priced at SwiGLU's rate unless measured
        bias_act = m.fused_bias_gelu
        act_k = "bias_gelu" if bias_act else ("geglu" if m.model_family.mlp == "geglu" else act)
        ew_f += k(f"{act_k}_fwd", BF16 * (3 if m.gated_mlp else 2) * act_rows, fallback=f"{act}_fwd")
        ew_b += k(f"{act_k}_bwd", BF16 * (5 if m.gated_mlp else 3) * act_rows, fallback=f"{act}_bwd")
        if not m.learned_positions:
            # runtime/rotary.py: one pass each way over the whole qkv GEMM output (v is copied out beside the
            # rotated q and k; backward also assembles the qkv gradient)
            rot_bytes = BF16 * 2 * T * m.qkv_width_local(t)
            ew_f += k("rotary_fwd", rot_bytes)
            ew_b += k("rotary_bwd", rot_bytes)
        qk_norm_fwd_s, qk_norm_bwd_s = self._qk_norm_s(T)
        ew_f += qk_norm_fwd_s
        ew_b += qk_norm_bwd_s
        # bias gradients: dY summed over its rows (runtime/parallel/tensor.py), column-parallel over all T
        # tokens of the local columns, row-parallel over this rank's sequence shard of all columns (3.6 ms of a
        # 128 ms GPT 1.3B step in a trace): qkv, proj (where the family or qkv_bias / attn_out_bias give them),
        # fc1 (unless inside the activation's backward), fc2
        sums = ([T * (m.qkv_width_local(t))] if m.has_qkv_bias else []) \
            + ([tok_t * h] if m.has_attn_out_bias else [])
        if m.has_bias and not m.is_moe:
            sums += ([] if bias_act else [T * (f // t)]) + [tok_t * h]
        ew_b += sum(k("bias_grad", BF16 * rows_x_cols) for rows_x_cols in sums)
        ew_sel = 2 * k(f"{norm}_fwd", BF16 * 2 * tok_t * h) \
            + k(f"{act_k}_fwd", BF16 * (3 if m.gated_mlp else 2) * act_rows, fallback=f"{act}_fwd") \
            + qk_norm_fwd_s  # inside the checkpointed attention core
        return ew_f, ew_b, ew_sel

    def _tp_comm_s(self, fwd: float, bwd: float) -> tuple[float, float]:
        """(forward, backward) exposed seconds of tensor parallelism (sequence parallel) beside the layer's calibrated
        GEMMs `fwd` and `bwd`: forward all-gathers before QKV and FC1 and reduce-scatters after out-proj and FC2;
        backward mirrors them and re-gathers the saved sharded inputs for wgrad; where the target gathers the QKV
        output (_gathers_qkv_output), that gather and its gradient's reduce-scatter too, exposed."""
        m, lay, prof = self.m, self.lay, self.prof
        t = lay.tp
        if t == 1:
            return 0.0, 0.0
        nbytes = BF16 * int(self.tokens) * m.hidden
        ag = self.group_collective_s("all_gather", nbytes, t, 1) * prof.eff("tp")
        rs = self.group_collective_s("reduce_scatter", nbytes, t, 1) * prof.eff("tp")
        n_pairs = 1 if m.is_moe else 2
        frac = self.target.tp_fraction(prof.overlap_hidden_fraction.get("tp", 0.0))
        tp_f = n_pairs * (ag + rs)
        tp_b = n_pairs * (2 * ag + rs)
        comm_tp_f = exposed_s(tp_f, fwd, frac, lay.overlap_tp)
        if lay.overlap_tp or not self.target.tp_backward_beside_gemms:
            comm_tp_b = exposed_s(tp_b, bwd, frac, lay.overlap_tp)
        else:  # the output gradient's gather exposed; the input's re-gather and the input gradient's
            # reduce-scatter beside the input- and weight-gradient GEMMs (RuntimeTarget.tp_backward_beside_gemms)
            comm_tp_b = n_pairs * ag + exposed_s(n_pairs * (ag + rs), bwd, frac, True)
        if self._gathers_qkv_output:  # the QKV output gathered forward, its gradient reduce-scattered backward:
            # between the QKV GEMM and the attention core that needs it, on the critical path
            qkv_bytes = BF16 * int(self.tokens) * (m.q_width + 2 * m.kv_width)
            comm_tp_f += self.group_collective_s("all_gather", qkv_bytes, t, 1) * prof.eff("tp")
            comm_tp_b += self.group_collective_s("reduce_scatter", qkv_bytes, t, 1) * prof.eff("tp")
        return comm_tp_f, comm_tp_b

    def _cp_comm_s(self, attn_f: float, attn_b: float) -> tuple[float, float]:
        """(forward, backward) exposed seconds of context parallelism beside the calibrated attention core: cp-1
        ring steps pass K and V forward; backward passes K, V and dK, dV (or one gather of K and V beside the local
        block, where the target gathers them)."""
        m, lay, prof = self.m, self.lay, self.prof
        if lay.cp == 1:
            return 0.0, 0.0
        t, s = lay.tp, self.shape.seq_len
        kv_bytes = BF16 * 2 * lay.micro_batch * max(self._cp_kv_heads // t, 1) * (s // lay.cp) * m.head_dim
        step = self.group_collective_s("send_recv", kv_bytes, lay.cp, self.strides["cp"]) * prof.eff("cp")
        frac = self.target.cp_fraction(prof.overlap_hidden_fraction.get("cp", 0.0))
        # dK, dV: cp - 1 steps beside the blocks in bf16; in fp32 through every rank with the last step waited
        # at once (RuntimeTarget.dkv_ring_fp32)
        if self.target.dkv_ring_fp32:
            grad_step = self.group_collective_s("send_recv", 2 * kv_bytes, lay.cp, self.strides["cp"]) \
                * prof.eff("cp")
            grad_beside, grad_last = (lay.cp - 1) * grad_step, grad_step
        else:
            grad_beside, grad_last = (lay.cp - 1) * step, 0.0
        if self.target.cp_kv_all_gather:  # one gather beside the local block (forward and backward)
            gather = self.group_collective_s("all_gather", kv_bytes * lay.cp, lay.cp, self.strides["cp"]) \
                * prof.eff("cp")
            cp_f = exposed_s(gather, attn_f / lay.cp, frac, True)
            cp_b = exposed_s(gather, attn_b / lay.cp, frac, True) \
                + exposed_s(grad_beside, attn_b * (lay.cp - 1) / lay.cp, frac, True) + grad_last
        else:
            cp_f = exposed_s((lay.cp - 1) * step, attn_f, frac, True)
            cp_b = exposed_s((lay.cp - 1) * step + grad_beside, attn_b, frac, True) + grad_last
        return cp_f, cp_b

    # -- ends -------------------------------------------------------------------------------------------
    @cached_property
    def ends(self) -> EndCosts:
        return self._memo("ends", self._ends)

    def _ends(self) -> EndCosts:
        m, lay, prof = self.m, self.lay, self.prof
        t, h, v = lay.tp, m.hidden, m.padded_vocab
        T = int(self.tokens)
        # embedding: gather rows forward, scatter-add fp32 gradient backward (memory-bound)
        emb = prof.kernel_s("embedding_fwd", BF16 * T * h * 2) + prof.memory_bound_s(FP32 * T * h * 3)
        hf, hb = self._gemm_fwd_bwd_s(T, v // t, h)
        if m.model_family.head_transform:  # its dense h -> h
            a, b = self._gemm_fwd_bwd_s(T, h, h)
            hf, hb = hf + a, hb + b
        ce = prof.kernel_s("cross_entropy_fwd_bwd", 2 * BF16 * T * v / t)  # the profiler's nominal bytes per logit
        comm = 0.0
        if t > 1:
            # the embedding's and the head's gather and scatter of [tokens, hidden], and the head's backward
            # re-gathering its sequence-sharded input for the weight gradient (runtime/parallel/tensor.py keeps
            # the input sharded between forward and backward): three all-gathers, two reduce-scatters
            nbytes = BF16 * T * h
            comm = 3 * self.group_collective_s("all_gather", nbytes, t, 1) \
                + 2 * self.group_collective_s("reduce_scatter", nbytes, t, 1)
            comm += self.group_collective_s("all_reduce", FP32 * T, t, 1)  # the loss: max
            comm += self.group_collective_s("all_reduce", 2 * FP32 * T, t, 1)  # sum of exp and target logit
        c = self.target.kernel_s(prof.eff("compute"))
        return EndCosts(embedding_s=emb * c, head_s=(hf + hb + ce) * c, head_comm_s=comm * prof.eff("tp"))
