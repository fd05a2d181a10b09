"""Fewer KV heads than TP ranks: each KV head replicated over the ranks that share it (runtime/parallel/tensor.py,
SharedKVQKVLinear) matches one process, for one KV head at TP 4 and for 4 KV heads at TP 8."""
import torch

from planner.plan import Layout
from runtime.mesh import build_groups, single_process_groups
from runtime.model import build_model, logical_name
from runtime.parallel.tensor import group_rank, group_size, local_shard
from tests.runtime.dist_util import run_workers
from tests.runtime.equiv import assert_close, draw_attention_biases, reference, run_case, tiny_spec

CASES_TP4 = [("llama+num_kv_heads=1", dict(tp=4, micro_batch=2, sharding="none"), None),
             ("llama+qkv_bias+num_kv_heads=1", dict(tp=2, dp=2, micro_batch=1, sharding="optimizer"),
              ["selective"] * 4)]
CASES_TP8 = [("llama+num_heads=8+num_kv_heads=4", dict(tp=8, micro_batch=2, sharding="none"), None)]


def _split_qkv(name: str, full: torch.Tensor, q_width: int) -> dict:
    """A one-process `...attn.qkv.weight` / `.bias` as the shared-KV module's q, k and v parameters."""
    stem, kind = name.rsplit(".", 1)
    q, k, v = full.split([q_width, (full.shape[0] - q_width) // 2, (full.shape[0] - q_width) // 2])
    return {f"{stem}.q_{kind}": q, f"{stem}.k_{kind}": k, f"{stem}.v_{kind}": v}


def _logical_reference_weights(spec, modes) -> dict:
    """The one-process model's initial weights, by name, with the fused qkv split as the shared-KV module names it."""
    ref = build_model(spec, single_process_groups(), modes)
    draw_attention_biases(ref, spec, single_process_groups())
    out = {}
    for n, p in ref.named_parameters():
        out.update(_split_qkv(n, p.detach(), spec.q_width) if ".attn.qkv." in n else {n: p.detach()})
    return out


def _worker(rank, world, cases):
    out = []
    for family, lay_kw, modes in cases:
        spec, lay = tiny_spec(family), Layout(**lay_kw)
        modes = modes or ["none"] * spec.num_layers
        groups = build_groups(lay, "cpu")
        weights = _logical_reference_weights(spec, modes)

        @torch.no_grad()
        def load(model):
            t, r = group_size(groups.tp), group_rank(groups.tp)
            for n, p in model.named_parameters():
                p.copy_(local_shard(weights[n], p.tp_dim, p.tp_parts, r, t))
                if ".attn.qkv." in n:  # checkpoints name them as the fused qkv's parts (runtime/checkpoint.py)
                    stem, leaf = n.rsplit(".", 1)
                    part = "qkv".index(leaf[0])
                    assert logical_name(n, p) == f"{stem}.{leaf[2:]}.part{part}", (n, logical_name(n, p))

        out.append(run_case(spec, lay, groups, modes, prepare=load))
    return out


def _check(cases, world):
    results = run_workers(_worker, world, cases)
    for (family, lay, modes), (losses, grads) in zip(cases, results):
        spec = tiny_spec(family)
        ref_losses, ref_grads = reference(family, modes)
        split = {}
        for n, g in ref_grads.items():
            split.update(_split_qkv(n, g, spec.q_width) if ".attn.qkv." in n else {n: g})
        assert_close((ref_losses, split), (losses, grads), f"{family} {lay} {modes}")


def test_one_kv_head_at_tp4():
    _check(CASES_TP4, 4)


def test_four_kv_heads_at_tp8():
    _check(CASES_TP8, 8)
