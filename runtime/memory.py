"""Measure what the runtime keeps for backward, so the planner's activation model can be checked against
the code rather than a description of it.

`saved_bytes_per_token(spec, mode)` runs one TransformerLayer forward (TP1, one process, CPU unless told)
under `torch.autograd.graph.saved_tensors_hooks` and sums the distinct storages autograd keeps,
excluding parameters. With TP t and sequence parallelism every term divides by t. CPU and GPU kernels
keep slightly different extras: SDPA keeps a log-sum-exp on both; F.rms_norm's CPU composite keeps its
normalised input as well (the CUDA fused kernel keeps input + rstd only).
"""
from __future__ import annotations

import torch


def saved_bytes_per_token(spec, mode: str = "none", micro_batch: int = 1, seq_len: int = 64,
                          dtype=torch.float32, device="cpu", part: str = "layer") -> float:
    """part: "layer" (one TransformerLayer) or "head" (final norm, output layer and loss)."""
    from runtime.mesh import single_process_groups
    from runtime.model import build_stage
    head = part == "head"
    stage = build_stage(spec, single_process_groups(), 0, 0 if head else 1, False, head, [] if head else [mode],
                        device=device).to(dtype)
    params = {p.untyped_storage().data_ptr() for p in stage.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            seen[ptr] = t.untyped_storage().nbytes()
        return t

    x = torch.randn(seq_len, micro_batch, spec.hidden, device=device, dtype=dtype, requires_grad=True)
    labels = torch.randint(0, spec.vocab_size, (micro_batch, seq_len), device=device) if head else None
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        stage(x, labels=labels)
    return sum(seen.values()) / (seq_len * micro_batch)
