"""Resume continues the loss curve; a checkpoint saved under one plan loads under another."""
import pickle

import pytest

from planner.model import tiny_model
from planner.plan import Layout
from runtime import checkpoint, manifest
from runtime.mesh import build_groups
from runtime.model import build_model
from runtime.parallel.data_parallel import AdamConfig, build_optimizer
from runtime.step import train_step
from tests.runtime.dist_util import run_workers
from tests.runtime.equiv import draw_attention_biases, micro_batches, tiny_spec


def _run(spec, lay_kw, ckpt_dir, steps, save_at=None, resume=False):
    lay = Layout(**lay_kw)
    groups = build_groups(lay, "cpu")
    model = build_model(spec, groups)
    draw_attention_biases(model, spec, groups)
    opt = build_optimizer([model], groups, lay.sharding, AdamConfig(lr=1e-3), bucket_elems=20_000)
    start = checkpoint.load(ckpt_dir, opt, groups) if resume else 0
    losses = []
    for step in range(start, start + steps):
        loss, _ = train_step([model], micro_batches(spec, step, lay.dp, groups.dp_rank, lay.micro_batch), opt, groups)
        losses.append(float(loss))
    if save_at is not None:
        checkpoint.save(ckpt_dir, start + steps, opt, groups)
    return losses, start


def worker(rank, world, family, phases, ckpt_dir):
    spec = tiny_spec(family)
    out = []
    for lay_kw, steps, save, resume in phases:
        out.append(_run(spec, lay_kw, ckpt_dir, steps, save_at=True if save else None, resume=resume))
    # saving the same step again must refuse
    lay = Layout(**phases[-1][0])
    groups = build_groups(lay, "cpu")
    model = build_model(spec, groups)
    opt = build_optimizer([model], groups, lay.sharding)
    try:
        checkpoint.save(ckpt_dir, 2, opt, groups)
        out.append("overwrote")
    except checkpoint.CheckpointError as exc:
        out.append(str(exc))
    return out


@pytest.mark.parametrize("family,first,second", [
    ("gpt", dict(tp=2, micro_batch=2, sharding="none"), dict(dp=2, micro_batch=1, sharding="optimizer")),
    ("llama", dict(dp=2, micro_batch=2, sharding="full"), dict(tp=2, micro_batch=4, sharding="none")),
    # the q/k/v bias saved as its logical parts from TP2 shards, read back whole (and the output bias)
    ("llama+qkv_bias+attn_out_bias", dict(tp=2, micro_batch=2, sharding="none"),
     dict(dp=2, micro_batch=1, sharding="optimizer")),
    # one KV head: saved from the fused qkv (DP2), resumed at TP2 where the K/V weights are whole on each rank
    # (runtime/parallel/tensor.py, SharedKVQKVLinear), read back from the fused parts
    ("llama+qkv_bias+num_kv_heads=1", dict(dp=2, micro_batch=1, sharding="optimizer"),
     dict(tp=2, micro_batch=2, sharding="none")),
    # Qwen3's q/k norm weights: replicated over TP, saved once and read back by every rank of the next plan
    ("llama+qk_norm+head_dim_override=24", dict(tp=2, micro_batch=2, sharding="optimizer"),
     dict(dp=2, micro_batch=1, sharding="full")),
])
def test_resume_under_another_plan(tmp_path, family, first, second):
    ref_losses, _ = _reference(family)
    phases = [(first, 2, True, False), (second, 2, False, True)]
    out = run_workers(worker, 2, family, phases, str(tmp_path), fresh_dirs=(str(tmp_path),))
    (l1, s1), (l2, s2), refusal = out
    assert s2 == 2
    for a, b in zip(ref_losses, l1 + l2):
        assert abs(a - b) < 1e-5, f"{l1 + l2} vs uninterrupted {ref_losses}"
    assert "refusing to overwrite" in refusal
    if "qk_norm" in family:  # whole [head_dim] tensors under their logical names, with their Adam moments
        from torch.distributed.checkpoint import FileSystemReader
        saved = FileSystemReader(str(checkpoint.step_dir(tmp_path, 2))).read_metadata().state_dict_metadata
        for key in checkpoint.KEYS:
            for norm in ("q_norm", "k_norm"):
                assert list(saved[f"{key}/layers.3.attn.{norm}"].size) == [24], (key, norm)


def _reference(family):
    from runtime.mesh import single_process_groups
    from tests.runtime.equiv import run_case
    spec = tiny_spec(family)
    return run_case(spec, Layout(sharding="none", micro_batch=2), single_process_groups(), ["none"] * 4, steps=4)


def _step(ckpt, name, complete):
    (ckpt / name).mkdir(parents=True)
    if complete:
        from torch.distributed.checkpoint.metadata import Metadata
        (ckpt / name / ".metadata").write_bytes(pickle.dumps(Metadata({}, storage_data={})))  # DCP metadata, no tensors
        manifest.write(ckpt / name, int(name[5:13]))


def test_resume_takes_the_newest_complete_checkpoint(tmp_path):
    """Interrupted saves leave no checkpoint: an empty step directory (a save from before saves were renamed) or a
    `.partial` one (even with its metadata, it was never renamed) is skipped, whatever `latest` says."""
    ck = tmp_path / "ck"
    _step(ck, "step-00000002", True)
    _step(ck, "step-00000004", True)
    _step(ck, "step-00000006", False)
    _step(ck, "step-00000008.partial", True)
    (ck / "latest").write_text("2\n")
    assert checkpoint.complete_steps(ck) == [2, 4]
    assert checkpoint.check_dir(ck, resume=True) == 4
    assert [p.name for p in checkpoint.incomplete_leftovers(ck)] == ["step-00000006", "step-00000008.partial"]
    with pytest.raises(checkpoint.CheckpointError, match="already holds checkpoints up to step 4"):
        checkpoint.check_dir(ck, resume=False)
    assert checkpoint.check_dir(tmp_path / "fresh", resume=False) is None


def _single_process_optimizer(family):
    from runtime.mesh import single_process_groups
    groups = single_process_groups()
    return build_optimizer([build_model(tiny_model(family), groups)], groups, "none"), groups


def test_save_moves_a_leftover_aside_and_load_names_a_foreign_checkpoint(tmp_path):
    """A save whose step directory an interrupted save left behind moves it aside (nothing deleted) and writes
    through a renamed `.partial`; a checkpoint of another model fails as CheckpointError, not as DCP's
    CheckpointException (a BaseException that `except Exception` misses)."""
    ck = tmp_path / "ck"
    _step(ck, "step-00000002", False)
    (ck / "step-00000002" / "__0_0.distcp").write_bytes(b"half")
    opt, groups = _single_process_optimizer("gpt")
    checkpoint.save(ck, 2, opt, groups)
    assert checkpoint.complete_steps(ck) == [2] and (ck / "latest").read_text() == "2\n"
    assert (ck / "step-00000002.incomplete" / "__0_0.distcp").read_bytes() == b"half"
    assert not (ck / "step-00000002.partial").exists()
    with pytest.raises(checkpoint.CheckpointError, match="refusing to overwrite"):
        checkpoint.save(ck, 2, opt, groups)
    llama_opt, groups = _single_process_optimizer("llama")
    with pytest.raises(checkpoint.CheckpointError, match="does not fit this model"):
        checkpoint.load(ck, llama_opt, groups)
