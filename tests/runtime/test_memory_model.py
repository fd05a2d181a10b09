"""The planner's activation count (planner.memory.layer_activations) against what the runtime's layer
really keeps for backward (runtime.memory.saved_bytes_per_token, measured with saved-tensor hooks).

The CPU run is fp32, so the planner is evaluated with 4-byte activations; on CPU the RMSNorm composite
also keeps its normalised input (one hidden-sized tensor per norm) which the CUDA kernel does not."""
import pytest

from planner import memory as mem
from planner.model import tiny_model
from planner.plan import Layout, TrainingShape
from runtime.memory import saved_bytes_per_token

SEQ = 64


@pytest.mark.parametrize("spec", [
    tiny_model("gpt", hidden=64, ffn_hidden=96, num_layers=1),
    tiny_model("llama", hidden=64, ffn_hidden=96, num_layers=1),
    tiny_model("llama", hidden=64, ffn_hidden=96, num_layers=1, num_experts=4, top_k=2),
], ids=["gpt", "llama", "moe"])
@pytest.mark.parametrize("mode", ["none", "selective", "full"])
def test_planner_counts_what_the_runtime_keeps(spec, mode, monkeypatch):
    monkeypatch.setattr(mem, "BF16_BYTES", 4)
    acts = mem.layer_activations(spec, TrainingShape(SEQ, 1), Layout(micro_batch=1, sharding="none"))
    planned = {"none": acts.none_bytes, "selective": acts.selective_bytes, "full": acts.full_bytes}[mode] / SEQ
    measured = saved_bytes_per_token(spec, mode, seq_len=SEQ)
    if spec.family == "llama" and mode != "full":
        # shared rotary tables: the planner counts them once per stage (mem.rotary_table_bytes)
        measured -= mem.rotary_table_bytes(spec, TrainingShape(SEQ, 1), Layout(micro_batch=1)) / SEQ
        measured -= 2 * 4 * spec.hidden  # CPU-only RMSNorm extra (see module docstring)
    # never below what the runtime keeps (an underestimate is an OOM), and not far above it
    assert planned >= measured * 0.99, (planned, measured)
    assert planned <= measured * 1.10, (planned, measured)


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


def _cpu_rms_norm_extra_per_token(hidden, dtype):
    """What F.rms_norm's CPU composite keeps beyond the CUDA kernel's input + fp32 rstd, per token."""
    import torch
    import torch.nn.functional as F
    seen = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    x = torch.randn(SEQ, hidden, dtype=dtype, requires_grad=True)
    w = torch.ones(hidden, dtype=dtype, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        F.rms_norm(x, (hidden,), w, 1e-5)
    seen.pop(w.untyped_storage().data_ptr(), None)
    return sum(seen.values()) / SEQ - (x.element_size() * hidden + 4)
