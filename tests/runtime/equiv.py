"""Shared pieces of the equivalence tests: one step of a layout vs a single-process run."""
from __future__ import annotations

import torch

from planner.model import tiny_model
from planner.plan import Layout
from runtime.mesh import build_groups, single_process_groups
from runtime.model import IGNORE_INDEX, build_model, init_weights
from runtime.parallel.data_parallel import GRAD_DTYPES, AdamConfig, build_optimizer
from runtime.parallel.tensor import gather_logical
from runtime.step import train_step

SEQ, GLOBAL_BATCH = 32, 8


def global_batch(spec, step):
    g = torch.Generator().manual_seed(100 + step)
    seq = torch.randint(0, spec.vocab_size, (GLOBAL_BATCH, SEQ + 1), generator=g)
    if spec.family == "bert":
        tokens = seq[:, :SEQ].clone()
        chosen = torch.rand(tokens.shape, generator=g) < 0.15
        labels = torch.where(chosen, tokens, torch.full_like(tokens, IGNORE_INDEX))
        tokens[chosen] = spec.vocab_size - 1
        types = (torch.arange(SEQ) >= SEQ // 2).long().expand(GLOBAL_BATCH, SEQ).contiguous()
        return dict(tokens=tokens, labels=labels, token_types=types)
    return dict(tokens=seq[:, :-1], labels=seq[:, 1:])


def micro_batches(spec, step, dp, dp_rank, mb):
    full = global_batch(spec, step)
    per = GLOBAL_BATCH // dp
    out = []
    for i in range(0, per, mb):
        lo = dp_rank * per + i
        out.append({k: v[lo:lo + mb] for k, v in full.items()})
    return out


def tiny_spec(model: str, **over):
    """The tiny model of a case: a family ('llama'), or a family with boolean spec fields turned on after '+'
    ('llama+qkv_bias', 'llama+qkv_bias+attn_out_bias') and whole-number fields set
    ('llama+qk_norm+head_dim_override=24', Qwen3-style: heads x head_dim is not the hidden size)."""
    family, *flags = model.split("+")
    fields = dict(f.split("=") if "=" in f else (f, True) for f in flags)
    return tiny_model(family, **{k: v if v is True else int(v) for k, v in fields.items()}, **over)


def draw_attention_biases(model, spec, groups, seed=1234):
    """Nonzero attention biases for a Llama-style spec that has them: the runtime starts them at zero (as Hugging
    Face and Megatron do), where a rank adding another rank's q/k/v part would go unnoticed. Each is drawn per
    logical tensor and sliced to this rank's shard by init_weights, rerun (every other tensor gets its values again)."""
    if spec.has_bias or not (spec.qkv_bias or spec.attn_out_bias):
        return
    for name, p in model.named_parameters():
        if name.endswith(("attn.qkv.bias", "attn.proj.bias")):
            p.init = ("normal", 0.02)
    init_weights(model, groups, seed)


def run_case(spec, lay: Layout, groups, modes, steps=2, prepare=None):
    """Returns losses of `steps` steps and logical grads of the first step (gathered over TP). prepare(model), when
    given, runs after initialisation (a test that sets the weights itself)."""
    model = build_model(spec, groups, modes, overlap=lay.overlap_tp, fp8=lay.fp8)
    draw_attention_biases(model, spec, groups)
    if prepare is not None:
        prepare(model)
    opt = build_optimizer([model], groups, lay.sharding, AdamConfig(lr=1e-3), overlap=lay.overlap_dp,
                          bucket_elems=20_000, grad_dtype=GRAD_DTYPES[lay.grad_dtype])
    grads = {}
    tp_of = {n: p for n, p in model.named_parameters()}  # after the optimizer (FSDP2 replaces parameters)

    def capture():
        for n, g in opt.full_local_grads().items():
            p = tp_of[n]
            grads[n] = gather_logical(g, p.tp_dim, p.tp_parts, groups.tp)

    losses = []
    for step in range(steps):
        mbs = micro_batches(spec, step, lay.dp, groups.dp_rank, lay.micro_batch)
        loss, _ = train_step([model], mbs, opt, groups, before_step=capture if step == 0 else None)
        losses.append(float(loss))
    return losses, grads


def reference(family, modes=None, **over):
    spec = tiny_spec(family, **over)
    lay = Layout(sharding="none", micro_batch=2)
    return run_case(spec, lay, single_process_groups(), modes or ["none"] * spec.num_layers)


def worker(rank, world, cases):
    out = []
    for family, lay_kw, modes in cases:
        spec = tiny_spec(family)
        lay = Layout(**lay_kw)
        groups = build_groups(lay, "cpu")
        out.append(run_case(spec, lay, groups, modes or ["none"] * spec.num_layers))
    return out


def assert_close(ref, got, what):
    (ref_losses, ref_grads), (losses, grads) = ref, got
    for a, b in zip(ref_losses, losses):
        assert abs(a - b) < 1e-5 * max(1.0, abs(a)), f"{what}: loss {b} vs single-process {a}"
    assert set(ref_grads) == set(grads), f"{what}: parameter names differ"
    for n in ref_grads:
        torch.testing.assert_close(grads[n], ref_grads[n], rtol=1e-4, atol=1e-6, msg=lambda m: f"{what} {n}: {m}")


def assert_close_bf16_grads(ref, got, what):
    """A run with bf16 main gradients against the fp32 single-process one: the first step's loss (taken
    before any update) exactly, the next within bf16 rounding of one update; each gradient within 1% of the
    reference's norm (bf16 keeps 8 significant bits: the adds of micro-batches and of the reduction round)."""
    (ref_losses, ref_grads), (losses, grads) = ref, got
    assert abs(ref_losses[0] - losses[0]) < 1e-5 * max(1.0, abs(ref_losses[0])), f"{what}: first loss {losses[0]}"
    for a, b in zip(ref_losses[1:], losses[1:]):
        assert abs(a - b) < 1e-3 * max(1.0, abs(a)), f"{what}: loss {b} vs single-process {a}"
    assert set(ref_grads) == set(grads), f"{what}: parameter names differ"
    for n in ref_grads:
        err = float((grads[n] - ref_grads[n]).norm())
        assert err <= 1e-2 * float(ref_grads[n].norm()) + 1e-7, f"{what} {n}: gradient off by {err} (norm {float(ref_grads[n].norm())})"
