"""The runtime's side of tests/runtime/hf/test_hf_weights.py: build this rank's pipeline stage, load a Hugging Face
folder into it, run one forward and backward (two stages by point-to-point sends), and measure the logits, the loss
and named gradients against transformers' (tests/runtime/hf/hf_models.py Reference). Importable by gloo workers."""
from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.distributed as dist

from planner.plan import Layout
from runtime.hf import load_hf_weights
from runtime.hf.names import hf_sources
from runtime.hf.save import assemble, hf_tensors
from runtime.mesh import build_groups, single_process_groups
from runtime.model import build_stage, logical_name
from runtime.parallel.tensor import gather_logical, group_size


def stage_range(spec, pp: int, pp_rank: int) -> tuple[int, int]:
    per = spec.num_layers // pp
    return pp_rank * per, (pp_rank + 1) * per


def build_loaded_stage(spec, groups, hf_dir):
    """This rank's stage (layers split evenly over the pipeline ranks) with the folder's weights."""
    pp = groups.layout.pp
    lo, hi = stage_range(spec, pp, groups.pp_rank)
    stage = build_stage(spec, groups, lo, hi, groups.pp_rank == 0, groups.pp_rank == pp - 1)
    load_hf_weights([stage], SimpleNamespace(model=spec), groups, hf_dir)
    return stage


def forward_backward(stage, groups, data: dict):
    """One forward and backward of data over the pipeline (1 or 2 stages); returns (loss or None, logits or None)
    on the last stage: the mean loss of labelled tokens and the logits [BATCH, SEQ, padded vocab / tp]."""
    spec, lay = stage.spec, groups.layout
    captured = {}
    if stage.head is not None:
        def keep(module, inputs, output):  # a copy: the cross-entropy's backward overwrites the logits' buffer
            captured["logits"] = output.detach().clone()
        stage.head.output.register_forward_hook(keep)
    step = lay.tp * lay.cp * lay.dp  # global-rank distance between consecutive pipeline stages
    if stage.embedding is not None:
        x = stage(data["tokens"], None, data.get("token_types"), data["labels"] if stage.head is not None else None)
    else:
        s_local = data["tokens"].shape[1] // group_size(groups.tp)
        x = torch.empty(s_local, data["tokens"].shape[0], spec.hidden)
        dist.recv(x, groups.rank - step)
        x.requires_grad_(True)
        inp = x
        x = stage(x, None, None, data["labels"])
    if stage.head is None:
        grad = torch.empty_like(x)
        dist.send(x.detach().contiguous(), groups.rank + step)
        dist.recv(grad, groups.rank + step)
        x.backward(grad)
        return None, None
    loss_sum, count = x
    loss = loss_sum / count
    loss.backward()
    if stage.embedding is None:
        dist.send(inp.grad.contiguous(), groups.rank - step)
    logits = captured["logits"]
    if spec.family == "bert":
        logits = logits + stage.head.decoder_bias
    return float(loss.detach()), logits


def gathered_grads(stage, groups, wanted: set) -> dict:
    """Logical gradients (TP shards gathered; sequence-parallel partial sums added over TP) of the wanted names."""
    out = {}
    for name, p in stage.named_parameters():
        lname = logical_name(name, p)
        if p.grad is None:
            continue
        g = p.grad.detach().clone()
        if getattr(p, "sequence_parallel", False) and groups.tp is not None:
            dist.all_reduce(g, group=groups.tp)
        g = gather_logical(g, p.tp_dim, p.tp_parts, groups.tp)
        if lname in wanted:
            out[lname] = (g, p)
    return out


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def measure(stage, groups, data: dict, ref, model_type: str, grad_names) -> dict:
    """{'logits': rel error or None, 'loss': abs error or None, 'grads': {hf name: rel error}} of this rank."""
    spec = stage.spec
    loss, logits = forward_backward(stage, groups, data)
    out = {"logits": None, "loss": None, "grads": {}}
    if logits is not None:
        full = gather_logical(logits.detach(), logits.dim() - 1, None, groups.tp)[..., :spec.vocab_size]
        out["logits"] = rel_err(full.transpose(0, 1), ref.logits)
        out["loss"] = abs(loss - ref.loss)
    sources = hf_sources(spec, model_type)
    found = []
    for lname, (g, p) in gathered_grads(stage, groups, set(grad_names)).items():
        found += hf_tensors(lname, g, p, sources[lname], spec.vocab_size)
    for hf_name, tensor in assemble(found).items():
        if hf_name in ref.grads:
            out["grads"][hf_name] = rel_err(tensor, ref.grads[hf_name])
    return out


def merge(results: list[dict]) -> dict:
    """The largest error of each kind over the ranks."""
    out = {"logits": None, "loss": None, "grads": {}}
    for r in results:
        for k in ("logits", "loss"):
            if r[k] is not None:
                out[k] = max(out[k] or 0.0, r[k])
        for n, e in r["grads"].items():
            out["grads"][n] = max(out["grads"].get(n, 0.0), e)
    return out


def single_process(spec, hf_dir, data, ref, model_type, grad_names) -> dict:
    groups = single_process_groups()
    stage = build_loaded_stage(spec, groups, hf_dir)
    return measure(stage, groups, data, ref, model_type, grad_names)


def worker(rank, world, lay_kw, spec, hf_dir, data, ref, model_type, grad_names, out_dir=None) -> dict:
    """A gloo rank of a multi-process case: returns (on rank 0) the errors merged over all ranks. out_dir: save the
    loaded weights (unchanged: no step is taken) there as a Hugging Face checkpoint afterwards."""
    from runtime.hf import save_hf_weights
    groups = build_groups(Layout(**lay_kw), "cpu")
    stage = build_loaded_stage(spec, groups, hf_dir)
    got = measure(stage, groups, data, ref, model_type, grad_names)
    everyone = [None] * world
    dist.all_gather_object(everyone, got)
    if out_dir is not None:
        save_hf_weights([stage], SimpleNamespace(model=spec), groups, out_dir, config=f"{hf_dir}/config.json")
    return merge(everyone)


def round_trip_worker(rank, world, spec, hf_dir, out_dir, data) -> torch.Tensor:
    """TP2 x DP2: load hf_dir, train 3 steps (each data-parallel rank its half of data), save to out_dir; returns
    (rank 0) the logits [BATCH, SEQ, vocab] of the trained weights on data's tokens."""
    from runtime.hf import save_hf_weights
    from runtime.parallel.data_parallel import AdamConfig, build_optimizer
    from runtime.step import train_step
    lay = Layout(tp=2, dp=2, sharding="none", micro_batch=1)
    groups = build_groups(lay, "cpu")
    stage = build_loaded_stage(spec, groups, hf_dir)
    opt = build_optimizer([stage], groups, lay.sharding, AdamConfig(lr=1e-3), overlap=False, bucket_elems=20_000)
    half = data["tokens"].shape[0] // 2
    mine = {k: v[groups.dp_rank * half:(groups.dp_rank + 1) * half] for k, v in data.items()}
    for _ in range(3):
        train_step([stage], [mine], opt, groups)
    captured = {}

    def keep(module, inputs, output):
        captured["logits"] = output.detach().clone()
    stage.head.output.register_forward_hook(keep)
    with torch.no_grad():
        stage(data["tokens"], None, None, data["labels"])
    logits = gather_logical(captured["logits"], 2, None, groups.tp)[..., :spec.vocab_size].transpose(0, 1)
    save_hf_weights([stage], SimpleNamespace(model=spec), groups, out_dir, config=f"{hf_dir}/config.json")
    return logits
