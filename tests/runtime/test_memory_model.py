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
