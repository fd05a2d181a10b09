"""Resume continues the loss curve; a checkpoint saved under one plan loads under another."""
import pytest

from planner.model import tiny_model
from planner.plan import Layout
from runtime import checkpoint
from runtime.mesh import build_groups
from runtime.model import build_model
from runtime.parallel.data import AdamConfig, build_optimizer
from runtime.step import train_step
from tests.runtime.dist_util import run_workers
from tests.runtime.equiv import micro_batches


def _run(spec, lay_kw, ckpt_dir, steps, save_at=None, resume=False):
    lay = Layout(**lay_kw)
    groups = build_groups(lay, "cpu")
    model = build_model(spec, groups)
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
    spec = tiny_model(family)
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
])
def test_resume_under_another_plan(tmp_path, family, first, second):
    ref_losses, _ = _reference(family)
    phases = [(first, 2, True, False), (second, 2, False, True)]
    out = run_workers(worker, 2, family, phases, str(tmp_path))
    (l1, s1), (l2, s2), refusal = out
    assert s2 == 2
    for a, b in zip(ref_losses, l1 + l2):
        assert abs(a - b) < 1e-5, f"{l1 + l2} vs uninterrupted {ref_losses}"
    assert "refusing to overwrite" in refusal


def _reference(family):
    from runtime.mesh import single_process_groups
    from tests.runtime.equiv import run_case
    spec = tiny_model(family)
    return run_case(spec, Layout(sharding="none", micro_batch=2), single_process_groups(), ["none"] * 4, steps=4)
