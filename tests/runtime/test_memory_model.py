"""The planner's activation count (planner.memory.layer_activations) against what the runtime's layer
really keeps for backward (runtime.memory.saved_bytes_per_token, measured with saved-tensor hooks).

The CPU run is fp32, so the planner is evaluated with 4-byte activations; on CPU the RMSNorm composite
also keeps its normalised input (one hidden-sized tensor per norm) which the CUDA kernel does not."""
import pytest

from planner import memory as mem
from planner.memory import activations  # the module itself: a test patches its constants
from planner.model import tiny_model
from planner.plan import Layout, TrainingShape
from runtime.memory import saved_bytes_per_token

SEQ = 64


@pytest.mark.parametrize("spec", [
    tiny_model("gpt", hidden=64, ffn_hidden=96, num_layers=1),
    tiny_model("llama", hidden=64, ffn_hidden=96, num_layers=1),
    tiny_model("llama", hidden=64, ffn_hidden=96, num_layers=1, num_experts=4, top_k=2),
    tiny_model("llama", hidden=64, ffn_hidden=96, num_layers=1, num_experts=4, top_k=2, shared_expert_ffn=160,
               shared_expert_gate=True),
    tiny_model("llama", hidden=64, ffn_hidden=96, num_layers=1, qk_norm=True, head_dim_override=24),
    tiny_model("gemma", hidden=64, ffn_hidden=96, num_layers=1, head_dim_override=24),
], ids=["gpt", "llama", "moe", "moe-shared", "qk-norm", "gemma"])
@pytest.mark.parametrize("mode", ["none", "selective", "full"])
def test_planner_counts_what_the_runtime_keeps(spec, mode, monkeypatch):
    monkeypatch.setattr(activations, "BF16_BYTES", 4)
    acts = mem.layer_activations(spec, TrainingShape(SEQ, 1), Layout(micro_batch=1, sharding="none"))
    planned = {"none": acts.none_bytes, "selective": acts.selective_bytes, "full": acts.full_bytes}[mode] / SEQ
    measured = saved_bytes_per_token(spec, mode, seq_len=SEQ)
    if not spec.layernorm and mode != "full":  # Llama-style RMSNorm and rotary (llama, gemma)
        # shared rotary tables: the planner counts them once per stage (mem.rotary_table_bytes)
        measured -= mem.rotary_table_bytes(spec, TrainingShape(SEQ, 1), Layout(micro_batch=1)) / SEQ
        measured -= 2 * 4 * spec.hidden  # CPU-only RMSNorm extra (see module docstring)
        if spec.qk_norm and mode == "none":  # likewise the q/k norms' (selective recomputes them)
            import torch
            measured -= sum(_cpu_rms_norm_extra_per_token(spec.head_dim, torch.float32, n)
                            for n in (spec.num_heads, spec.num_kv_heads))
    # never below what the runtime keeps (an underestimate is an OOM), and not far above it
    assert planned >= measured * 0.99, (planned, measured)
    assert planned <= measured * 1.10, (planned, measured)


@pytest.mark.parametrize("mode", ["none", "selective", "full"])
def test_the_erf_gelu_keeps_what_the_fused_tanh_bias_gelu_keeps(mode):
    """BERT's exact GELU (fc1's bias in the GEMM, torch's GELU keeping its input) keeps the bytes the fused tanh
    bias-GELU keeps (its input, the GEMM output), which is what the planner counts for both forms."""
    from dataclasses import replace
    tanh = tiny_model("bert", hidden=64, ffn_hidden=96, num_layers=1)
    erf = replace(tanh, gelu_approximate="none")
    assert saved_bytes_per_token(erf, mode, seq_len=SEQ) == saved_bytes_per_token(tanh, mode, seq_len=SEQ)
    shape, lay = TrainingShape(SEQ, 1), Layout(micro_batch=1, sharding="none")
    assert mem.layer_activations(erf, shape, lay) == mem.layer_activations(tanh, shape, lay)


@pytest.mark.parametrize("family", ["gpt", "llama"])
def test_planner_counts_what_the_head_keeps(family):
    """Final norm, output layer and loss, in bf16: the cross-entropy keeps the logits' gradient (V values per
    token in the compute dtype), not an fp32 softmax beside the logits (which would count 2V more bytes)."""
    import torch
    spec = tiny_model(family, hidden=64, ffn_hidden=96, num_layers=1, vocab_size=1000)
    kept, _ = mem.head_activation_bytes(spec, TrainingShape(SEQ, 1), Layout(micro_batch=1, sharding="none"))
    measured = saved_bytes_per_token(spec, seq_len=SEQ, part="head", dtype=torch.bfloat16)
    if family == "llama":
        measured -= _cpu_rms_norm_extra_per_token(spec.hidden, torch.bfloat16)
    assert measured * 0.99 <= kept / SEQ <= measured * 1.10, (kept / SEQ, measured)


def _cpu_rms_norm_extra_per_token(hidden, dtype, heads=1):
    """What F.rms_norm's CPU composite keeps beyond the CUDA kernel's input + fp32 rstd, per token, normalising
    `heads` rows of `hidden` per token (the q/k norms: one per head)."""
    import torch
    import torch.nn.functional as F
    seen = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    x = torch.randn(SEQ, heads, hidden, dtype=dtype, requires_grad=True)
    w = torch.ones(hidden, dtype=dtype, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        F.rms_norm(x, (hidden,), w, 1e-5)
    seen.pop(w.untyped_storage().data_ptr(), None)
    return sum(seen.values()) / SEQ - heads * (x.element_size() * hidden + 4)


@pytest.mark.parametrize("family", ["gpt", "llama"])
def test_zero2_reduction_buffers_within_the_planner_count(family):
    """ZeRO-2 (sharding optimizer+grads) keeps full fp32 gradient buckets alive while they are filled and
    reduced: the most alive at once in a real backward (two micro-batches, small buckets so that there are
    many) stays within planner.memory.dp_reduction_transient_bytes."""
    import torch

    from runtime.mesh import single_process_groups
    from runtime.model import build_model
    from runtime.parallel import data_parallel as D
    from runtime.parallel.flat_buffer import FlatBuffer

    spec = tiny_model(family, num_layers=4)
    bucket = 3000
    model = build_model(spec, single_process_groups())
    opt = D.DistributedOptimizer([model], single_process_groups(), "optimizer+grads", D.AdamConfig(),
                                 bucket_elems=bucket)
    peak = [0]
    original = FlatBuffer.grad_view

    def grad_view(self, p):
        view = original(self, p)
        peak[0] = max(peak[0], sum(4 * b.size for b in self.buckets if b.full is not None))
        return view

    FlatBuffer.grad_view = grad_view
    try:
        seq = torch.randint(0, spec.vocab_size, (2, 2, 17), generator=torch.Generator().manual_seed(0))
        opt.zero_grad()
        for i in range(2):
            opt.begin_micro_batch(last=i == 1)
            loss, _ = model(seq[i, :, :-1], None, None, seq[i, :, 1:])
            loss.backward()
        opt.finish_grads()
    finally:
        FlatBuffer.grad_view = original
        opt.close()
    lay = Layout(dp=2, micro_batch=1, sharding="optimizer+grads")
    planned = mem.dp_reduction_transient_bytes(0, 0, lay, mem.largest_layer_param_local(spec, 1),
                                               mem.largest_param_local(spec, 1), bucket_elems=bucket)
    assert peak[0] > 2 * 4 * bucket, "more than two buckets alive: the count the planner used to make"
    assert peak[0] <= planned <= 3 * peak[0], (peak[0], planned)


def test_tp_replicated_gradient_tensors_match_the_runtime_model():
    """memory.tp_replicated_tensors lists exactly the parameters runtime/model.py marks sequence_parallel
    (replicated over TP, their gradients all-reduced over TP): counted here from a built tiny model."""
    from dataclasses import replace as dc_replace
    from planner.memory import tp_replicated_tensors
    from planner.model import tiny_model
    from runtime.mesh import single_process_groups
    from runtime.model import build_stage
    for spec in (tiny_model("gpt"), tiny_model("llama"), tiny_model("bert"),
                 tiny_model("llama", num_experts=4, top_k=2), dc_replace(tiny_model("gpt"), num_experts=4, top_k=2),
                 tiny_model("llama", num_experts=4, top_k=2, shared_expert_ffn=96, shared_expert_gate=True),
                 tiny_model("llama", qkv_bias=True, attn_out_bias=True),
                 tiny_model("llama", qk_norm=True, head_dim_override=24)):
        stage = build_stage(spec, single_process_groups(), 0, spec.num_layers, True, True,
                            ["none"] * spec.num_layers, device="cpu")
        want = sorted(p.numel() for p in stage.parameters() if getattr(p, "sequence_parallel", False))
        got = sorted(e for n, e in tp_replicated_tensors(spec, 1, spec.num_layers, True, True)
                     for _ in range(int(n)))
        assert got == want, spec.name



@pytest.mark.parametrize("grad_dtype", ["fp32", "bf16"])
def test_optimizer_state_is_what_the_planner_counts(grad_dtype):
    """The distributed optimizer's persistent buffers per parameter (sharding 'none', one process): main
    gradient 4 or 2 B (Layout.grad_dtype), fp32 master, m and v 12 B, as planner.memory.bytes_per_param counts
    them beside the 2 B bf16 weight (here the CPU run's weights are fp32, so that part is left out)."""
    from runtime.mesh import single_process_groups
    from runtime.model import build_model
    from runtime.parallel import data_parallel as D

    spec = tiny_model("gpt", num_layers=2)
    model = build_model(spec, single_process_groups())
    opt = D.build_optimizer([model], single_process_groups(), "none", D.AdamConfig(),
                            grad_dtype=D.GRAD_DTYPES[grad_dtype])
    try:
        (buf,) = opt.buffers
        state = buf.main_grad.nbytes + sum(t.nbytes for ts in (buf.master, buf.m, buf.v) for t in ts)
        planned = mem.bytes_per_param("none", 1, mem.grad_bytes(Layout(grad_dtype=grad_dtype))) - mem.BF16_BYTES
        assert state == planned * buf.total
    finally:
        opt.close()
