"""Per step: the data-parallel gradient and parameter traffic that backward and forward do not hide, the
tensor-parallel reduction of fused weight gradients, and the optimizer step over the local shard."""
from __future__ import annotations

from planner import memory as mem
from planner.cost.terms import ADAMW_GRAD_SCALE, BF16, FP32
from planner.legality import GROUPED_GEMM_GPUS


class DataParallelTerms:
    """CostModel's per-step gradient, parameter and optimizer times."""

    # -- per step -----------------------------------------------------------------------------------------
    def dp_comm_s(self, dense: float, expert: float, window_fwd_s: float, window_bwd_s: float, num_micro: int) -> float:
        """Exposed data-parallel traffic of one rank per step. `window_fwd_s` and `window_bwd_s`: one micro-batch's
        forward and backward of the rank's layers, which dp_window_micro_batches widens in an interleaved pipeline."""
        lay, frac = self.lay, self.prof.overlap_hidden_fraction.get("dp", 0.0)
        d = lay.dp * lay.cp
        total = 0.0
        mb_fwd_s, mb_bwd_s = window_fwd_s, window_bwd_s  # 'full' gathers and reduces every micro-batch beside it
        rounds = self.dp_window_micro_batches(num_micro)
        window_fwd_s, window_bwd_s = rounds * window_fwd_s, rounds * window_bwd_s

        def exposed_s(comm_s, beside_s, frac, overlap):  # the target's rule (its buckets), ours: terms.exposed_s
            return self.target.dp_exposed_s(comm_s, params, beside_s, frac, overlap, d, lay.vpp)

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
                total += self.zero2_reductions * exposed_s(rs, window_bwd_s, frac, lay.overlap_dp) \
                    + exposed_s(ag, window_fwd_s, frac, lay.overlap_dp)
            else:  # full: gather for forward and again for backward, reduce-scatter, every micro-batch
                total += num_micro * (exposed_s(ag, mb_fwd_s, frac, lay.overlap_dp)
                                      + exposed_s(ag + rs, mb_bwd_s, frac, lay.overlap_dp))
        return total

    def dp_window_micro_batches(self, num_micro: int) -> int:
        """Micro-batches of the rank's compute that its gradient reduction runs beside (and, the mirror, the next
        step's parameter gather). The reduction of a model chunk starts on the chunk's last micro-batch (Megatron-
        Core's interleaved schedule enables a chunk's grad sync there; runtime/parallel/pipeline.py likewise). Without
        interleaving that is the step's last backward: one micro-batch. Interleaved, the schedule runs each chunk's
        backward for min(pp, micro-batches) micro-batches in turn, so the chunks' last backwards, and their
        reductions, are that many micro-batches of one chunk apart: the rank's buckets become ready over
        min(pp, micro-batches) micro-batches of all its layers' backward. The forward's gathers mirror it (the
        warm-up runs each chunk's forward for that many micro-batches before the next chunk's first)."""
        lay = self.lay
        return min(lay.pp, num_micro) if lay.vpp > 1 and lay.sharding != "full" else 1

    @property
    def zero2_reductions(self) -> int:
        """Times per step ZeRO-2 reduces the gradients (and the TP-replicated ones): every micro-batch without a
        pipeline; in a pipeline once, on each chunk's last micro-batch (runtime/parallel/pipeline.py sets the
        optimizer's sync there; planner/memory/model.py state_parts_per_param counts what that holds)."""
        return self.num_micro if self.lay.pp == 1 else 1

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
        word = m.padded_vocab * m.hidden / lay.tp
        tied_copy = last and m.tie_embeddings and lay.pp > 1  # the last stage's own copy of the tied weight
        # MoE experts on Hopper: their grouped weight-gradient GEMM accumulates into main_grad itself
        # (runtime/grouped_wgrad.py); elsewhere their gradients are added per micro-batch
        experts = mem.layer_expert_params_local(m, lay.ep) if m.is_moe and self.cluster.gpu in GROUPED_GEMM_GPUS else 0.0
        return layers * (mem.layer_gemm_weights_local(m, lay.tp) + experts) \
            + (mem.head_gemm_weights_local(m, lay.tp) if last else 0.0) \
            + (word if first else 0.0) + (word if tied_copy else 0.0)

    def tied_embedding_grad_bytes(self, first: bool, last: bool) -> float:
        """Bytes of the tied word embedding's gradient that the first and the last pipeline rank sum between them
        once per step (runtime/parallel/pipeline.py finish_gradients), before the data-parallel reduction: the
        rank's [vocab / tp, hidden] gradient in the main gradients' precision, or under 'full' its shard over
        dp x cp in fp32 (FSDP2 keeps the sharded gradient in the fp32 parameter's dtype). 0 on a rank that holds
        no copy, without a pipeline or without tied embeddings."""
        lay, m = self.lay, self.m
        if lay.pp == 1 or not m.tie_embeddings or not (first or last):
            return 0.0
        word = m.padded_vocab * m.hidden / lay.tp
        if lay.sharding == "full":
            return mem.FP32_BYTES * word / (lay.dp * lay.cp)
        return mem.grad_bytes(lay) * word

    def tied_embedding_reduce_s(self, first: bool, last: bool) -> float:
        """The all-reduce of tied_embedding_grad_bytes between the first and the last pipeline rank (a group of two,
        pp - 1 pipeline strides apart), exposed: it runs after the last backward and before the data-parallel
        reduction starts."""
        nbytes = self.tied_embedding_grad_bytes(first, last)
        if nbytes <= 0:
            return 0.0
        stride = self.strides["pp"] * (self.lay.pp - 1)
        return self.group_collective_s("all_reduce", nbytes, 2, stride) * self.prof.eff("dp")

    def tp_grad_reduce_s(self, layers: float, first: bool, last: bool, num_micro: int) -> float:
        """The TP all-reduces of the gradients of TP-replicated parameters (memory.tp_replicated_tensors), one
        fp32 call per tensor, issued in backward's gradient hooks on the compute stream: exposed. Once per step
        (on the last micro-batch), under 'optimizer+grads' as often as its gradients are reduced
        (zero2_reductions); under 'full' on the rank's shard of each. Under MoE with TP the experts' weights are among
        them: 2 GiB per step for moe-small at TP2 (11 ms on H200). The K/V weights of KV heads fewer than TP ranks
        are among them unless the target gathers the QKV output instead (RuntimeTarget.qkv_output_gather)."""
        lay = self.lay
        if lay.tp == 1:
            return 0.0
        shard = lay.dp * lay.cp if lay.sharding == "full" else 1
        calls = self.zero2_reductions if lay.sharding == "optimizer+grads" else 1
        grad = mem.grad_bytes(lay)
        kv_tp = 1 if self.target.qkv_output_gather else lay.tp  # K/V weights sharded, not replicated, there
        t = sum(n * self.group_collective_s("all_reduce", grad * elems / shard, lay.tp, self.strides["tp"])
                for n, elems in mem.tp_replicated_tensors(self.m, lay.ep, layers, first, last, kv_tp))
        return calls * t * self.prof.eff("tp")

    def optimizer_s(self, dense: float, expert: float, fused: float = 0.0) -> float:
        """AdamW over the local master shard, plus the runtime's per-parameter bookkeeping around it
        (`fused`: the rank's GEMM weights with gradient-accumulation fusion, see fused_wgrad_params)."""
        lay = self.lay
        d = lay.dp * lay.cp if lay.sharding != "none" else 1
        de = max(d // lay.ep, 1) if lay.sharding != "none" else 1
        shard = dense / d + expert / de
        num_micro = self.num_micro
        return (shard * self.prof.optimizer_s_per_param * ADAMW_GRAD_SCALE[lay.grad_dtype]
                + self.param_bookkeeping_s(dense + expert, shard, num_micro, fused)) * self.prof.eff("optimizer")

    def param_bookkeeping_s(self, local: float, shard: float, num_micro: int, fused: float = 0.0) -> float:
        """Memory traffic the runtime's mixed precision adds per step (counted from runtime/parallel/data_parallel.py):
        every micro-batch each bf16 gradient is added into its fp32 main gradient (read 2 + 4, write 4 B; with
        bf16 main gradients (Layout.grad_dtype) every fp32 figure here is 2 B),
        except the `fused` GEMM weights whose weight-gradient GEMM accumulates into the fp32 main gradient
        itself (that cost is in the profiled wgrad GEMM times); once per step the main gradients are zeroed
        (4 B); over the local shard the gradient norm is read (4 B), except without a data-parallel group,
        where the runtime takes each bucket's norm beside the rest of backward (runtime/parallel/data_parallel.py).
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
