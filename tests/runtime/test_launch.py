"""`plan launch`: refusals in one sentence, and a CPU run that checkpoints and resumes on the same curve."""
import csv
import json

import pytest

from planner.model import tiny_model
from planner.plan import Layout, Plan, TrainingShape, even_stages
from runtime.launch import main


def write_plan(path, **lay):
    spec = tiny_model("llama")
    layout = Layout(**lay)
    plan = Plan(model=spec, cluster={"num_gpus": layout.world_size}, training=TrainingShape(32, 8), layout=layout,
                stages=even_stages(spec.num_layers, 1, "selective"))
    path.write_text(json.dumps(plan.to_dict()))
    return path


def test_world_size_mismatch_is_refused(tmp_path, capsys):
    plan = write_plan(tmp_path / "p.json", tp=2, micro_batch=2, sharding="none")
    assert main([str(plan), "--device", "cpu", "--nproc-per-node", "4"]) != 0
    err = capsys.readouterr().err.strip()
    assert "needs 2 processes" in err and "\n" not in err


def test_bad_data_and_existing_results_are_refused(tmp_path, capsys):
    plan = write_plan(tmp_path / "p.json", tp=2, micro_batch=2, sharding="none")
    assert main([str(plan), "--device", "cpu", "--data", str(tmp_path / "missing.bin")]) != 0
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "r.csv").write_text("x\n")
    assert main([str(plan), "--device", "cpu", "--results", str(tmp_path / "r.csv")]) != 0
    assert "already exists" in capsys.readouterr().err


def _losses(path):
    with open(path) as f:
        return [float(r["loss"]) for r in csv.DictReader(f)]


def test_cpu_launch_checkpoint_and_resume(tmp_path):
    plan = write_plan(tmp_path / "p.json", tp=1, dp=2, micro_batch=2, sharding="optimizer")
    base = ["--device", "cpu", "--lr", "1e-3"]
    assert main([str(plan), "--steps", "4", "--results", str(tmp_path / "a.csv")] + base) == 0
    ck = str(tmp_path / "ck")
    assert main([str(plan), "--steps", "2", "--results", str(tmp_path / "b.csv"), "--ckpt-dir", ck] + base) == 0
    # the first half as a run from before the step CSV had end_unix_s wrote it: the resumed run keeps that header
    with open(tmp_path / "b.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    old_fields = [k for k in rows[0] if k != "end_unix_s"]
    with open(tmp_path / "b.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=old_fields, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    assert main([str(plan), "--steps", "2", "--results", str(tmp_path / "b.csv"), "--ckpt-dir", ck,
                 "--resume"] + base) == 0
    a, b = _losses(tmp_path / "a.csv"), _losses(tmp_path / "b.csv")
    assert len(a) == len(b) == 4
    assert a == pytest.approx(b, abs=2e-6)
    with open(tmp_path / "b.csv", newline="") as f:
        assert all(None not in r for r in csv.DictReader(f))   # no values beyond the header
    with open(tmp_path / "a.csv", newline="") as f:
        assert all(float(r["end_unix_s"]) > 1.7e9 for r in csv.DictReader(f))


def test_mid_run_checkpoint_holds_its_own_step(tmp_path):
    """The loop keeps one step queued ahead; a checkpoint due after step 2 must still hold step 2's state,
    not step 3's (which the loop would otherwise have launched before reading step 2 back)."""
    plan = write_plan(tmp_path / "p.json", tp=1, dp=1, micro_batch=2, sharding="none")
    base = ["--device", "cpu", "--lr", "1e-3", "--nproc-per-node", "1"]
    ck = tmp_path / "ck"
    assert main([str(plan), "--steps", "4", "--results", str(tmp_path / "a.csv"), "--ckpt-dir", str(ck),
                 "--save-every", "2"] + base) == 0
    import shutil
    shutil.rmtree(ck / "step-00000004")  # resume from the mid-run checkpoint, not the one at exit
    (ck / "latest").write_text("2")
    assert main([str(plan), "--steps", "2", "--results", str(tmp_path / "b.csv"), "--ckpt-dir", str(ck),
                 "--resume"] + base) == 0
    a, b = _losses(tmp_path / "a.csv"), _losses(tmp_path / "b.csv")
    assert len(a) == 4 and len(b) == 2
    assert a[2:] == pytest.approx(b, abs=2e-6)


def test_cpu_launch_fully_sharded(tmp_path):
    """FSDP (sharding 'full') through the training loop: its norm is a tensor like the other optimizers'."""
    plan = write_plan(tmp_path / "p.json", tp=1, dp=2, micro_batch=2, sharding="full")
    assert main([str(plan), "--steps", "3", "--results", str(tmp_path / "a.csv"), "--device", "cpu"]) == 0
    assert len(_losses(tmp_path / "a.csv")) == 3
