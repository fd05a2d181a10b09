"""`plan launch`: refusals in one sentence, and a CPU run that checkpoints and resumes on the same curve."""
import csv
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from planner.errors import PlanError
from planner.launch_command import WORKER_ERROR_FILE_ENV
from planner.lr_schedule import LrSchedule, OptimizerSettings, settings_from_dict
from planner.model import tiny_model
from planner.plan import Layout, Plan, TrainingShape, even_stages
from runtime import manifest
from runtime.launch import main

ROOT = Path(__file__).resolve().parents[2]


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
    """A cosine learning-rate schedule too: the resumed run continues it (the step CSV's lr) and the loss curve."""
    plan = write_plan(tmp_path / "p.json", tp=1, dp=2, micro_batch=2, sharding="optimizer")
    base = ["--device", "cpu", "--lr", "1e-3", "--lr-warmup-steps", "1", "--lr-decay-style", "cosine",
            "--lr-decay-steps", "4", "--min-lr", "1e-4"]
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
    schedule = LrSchedule(peak_lr=1e-3, min_lr=1e-4, warmup_steps=1, decay_style="cosine", decay_steps=4)
    for step in (2, 4):  # each checkpoint records the settings it trained with
        recorded = json.loads((tmp_path / "ck" / f"step-{step:08d}" / "training.json").read_text())
        assert settings_from_dict(recorded) == OptimizerSettings(schedule)
    for name in ("a.csv", "b.csv"):
        with open(tmp_path / name, newline="") as f:
            lrs = [float(r["lr"]) for r in csv.DictReader(f)]
        assert lrs == pytest.approx([schedule.at(s) for s in range(4)], rel=1e-3)
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


def _one_sentence(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    return err


def _fake_checkpoint(ckpt, step):
    """A step directory as a completed save leaves it (DCP's .metadata written last), for checks on the folder."""
    (ckpt / f"step-{step:08d}").mkdir(parents=True)
    import pickle
    from torch.distributed.checkpoint.metadata import Metadata
    (ckpt / f"step-{step:08d}" / ".metadata").write_bytes(pickle.dumps(Metadata({}, storage_data={})))  # no tensors
    manifest.write(ckpt / f"step-{step:08d}", step)


def _save_in_process(ckpt, family, step):
    """A real checkpoint of a tiny `family` model at `step`, saved without torchrun (faster than a launch)."""
    from runtime import checkpoint
    from runtime.mesh import single_process_groups
    from runtime.model import build_model
    from runtime.parallel.data_parallel import build_optimizer
    groups = single_process_groups()
    opt = build_optimizer([build_model(tiny_model(family), groups)], groups, "none")
    checkpoint.save(ckpt, step, opt, groups)


def test_steps_and_output_paths_are_refused_before_torchrun(tmp_path, capsys):
    plan = str(write_plan(tmp_path / "p.json", tp=1, micro_batch=2, sharding="none"))
    base = [plan, "--device", "cpu", "--nproc-per-node", "1"]
    for steps in ("0", "-3"):  # --steps 0 once wrote a step-00000000 checkpoint; -3 exited 0 having done nothing
        assert main(base + ["--steps", steps, "--ckpt-dir", str(tmp_path / "ck")]) == 1
        assert "--steps must be at least 1" in _one_sentence(capsys)
    assert main(base + ["--results", str(tmp_path / "missing" / "r.csv")]) == 1
    assert "does not exist" in _one_sentence(capsys)
    (tmp_path / "afile").write_text("")
    assert main(base + ["--ckpt-dir", str(tmp_path / "afile")]) == 1
    assert "is a file" in _one_sentence(capsys)
    assert not (tmp_path / "ck").exists() and not (tmp_path / "p.results.csv").exists()


def test_checkpoint_folder_is_checked_before_torchrun(tmp_path, capsys):
    plan = str(write_plan(tmp_path / "p.json", tp=1, micro_batch=2, sharding="none"))
    base = [plan, "--device", "cpu", "--nproc-per-node", "1", "--results", str(tmp_path / "r.csv")]
    ck = tmp_path / "ck"
    _fake_checkpoint(ck, 2)
    (ck / "latest").write_text("2\n")
    assert main(base + ["--ckpt-dir", str(ck)]) == 1  # a fresh run into an earlier run's checkpoints
    assert "already holds checkpoints up to step 2" in _one_sentence(capsys)
    (ck / "latest").write_text("two\n")
    assert main(base + ["--ckpt-dir", str(ck), "--resume"]) == 1
    assert "does not hold a step number" in _one_sentence(capsys)
    (tmp_path / "empty").mkdir()
    for folder in ("empty", "missing"):  # --resume once started at step 0 here, appending to the step CSV
        assert main(base + ["--ckpt-dir", str(tmp_path / folder), "--resume"]) == 1
        assert "no complete checkpoint" in _one_sentence(capsys)
    assert (ck / "latest").read_text() == "two\n" and not (tmp_path / "r.csv").exists()


def test_resume_under_another_lr_schedule_is_refused_unless_overridden(tmp_path, capsys):
    """A checkpoint records the schedule and AdamW settings it trained with (training.json); resuming with others
    would jump the learning rate, so it is refused before torchrun unless --override-lr-schedule says so."""
    plan = str(write_plan(tmp_path / "p.json", tp=1, micro_batch=2, sharding="none"))
    ck = tmp_path / "ck"
    _fake_checkpoint(ck, 2)
    saved = OptimizerSettings(LrSchedule(peak_lr=1e-3, decay_style="cosine", decay_steps=100))
    (ck / "step-00000002" / "training.json").write_text(json.dumps(asdict(saved)))
    manifest.write(ck / "step-00000002", 2)
    base = [plan, "--device", "cpu", "--nproc-per-node", "1", "--results", str(tmp_path / "r.csv"), "--ckpt-dir",
            str(ck), "--resume", "--dry-run", "--lr", "1e-3", "--lr-decay-style", "cosine"]
    assert main(base + ["--lr-decay-steps", "100"]) == 0  # the same settings
    capsys.readouterr()
    assert main(base + ["--lr-decay-steps", "200"]) == 1
    err = _one_sentence(capsys)
    assert "was trained with --lr 0.001 --lr-decay-style cosine --lr-decay-steps 100" in err
    assert "asks for --lr 0.001 --lr-decay-style cosine --lr-decay-steps 200" in err and "--override-lr-schedule" in err
    assert main(base + ["--lr-decay-steps", "200", "--override-lr-schedule"]) == 0
    assert "--override-lr-schedule" in capsys.readouterr().out  # the workers are told too
    assert main([plan, "--device", "cpu", "--override-lr-schedule", "--results", str(tmp_path / "r.csv")]) == 1
    assert "--override-lr-schedule needs --resume" in _one_sentence(capsys)
    (ck / "step-00000002" / "training.json").write_text("{not json")
    manifest.write(ck / "step-00000002", 2)  # as a save wrote it: the manifest matches, the JSON does not parse
    assert main(base + ["--lr-decay-steps", "100"]) == 1
    assert "is not readable JSON" in _one_sentence(capsys)


def test_nodes_are_checked(tmp_path, capsys):
    tp2 = str(write_plan(tmp_path / "tp2.json", tp=2, micro_batch=2, sharding="none"))
    assert main([tp2, "--device", "cpu", "--nnodes", "2", "--rdzv-endpoint", "n0:29500"]) == 1
    assert "multiple of tp 2" in _one_sentence(capsys)  # one rank per node would split each TP pair
    dp2 = str(write_plan(tmp_path / "dp2.json", dp=2, micro_batch=2, sharding="none"))
    assert main([dp2, "--device", "cpu", "--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "n0:29500"]) == 1
    assert "--node-rank 2 is not one of the 2 node(s)" in _one_sentence(capsys)


def test_worker_checks_before_joining_the_group(tmp_path, monkeypatch):
    """The worker's own guard (files may change after `plan launch` checked them): every rank refuses before
    init_process_group, so none trains into a failure; under `plan launch` the first rank's sentence goes to the
    error file, once."""
    from runtime import train
    plan = str(write_plan(tmp_path / "p.json", tp=1, micro_batch=2, sharding="none"))
    ck = tmp_path / "ck"
    _fake_checkpoint(ck, 3)
    base = ["--plan", plan, "--device", "cpu", "--results", str(tmp_path / "r.csv")]
    with pytest.raises(PlanError, match="already holds checkpoints"):
        train.main(base + ["--ckpt-dir", str(ck)])
    with pytest.raises(PlanError, match="no complete checkpoint"):
        train.main(base + ["--ckpt-dir", str(tmp_path / "none"), "--resume"])
    with pytest.raises(PlanError, match="at least 1"):
        train.main(base + ["--steps", "0"])
    with pytest.raises(PlanError, match="does not exist"):
        train.main(["--plan", plan, "--device", "cpu", "--results", str(tmp_path / "no" / "r.csv")])
    monkeypatch.setenv(WORKER_ERROR_FILE_ENV, str(tmp_path / "err"))
    train.report_error(PlanError("first"))
    train.report_error(PlanError("second"))
    assert (tmp_path / "err").read_text() == "1\nfirst\n"


@pytest.mark.parametrize("flag, value", [("--steps", "0"), ("--save-every", "-1"), ("--peak-tflops", "nan"),
                                         ("--memory-step", "-2"), ("--data-dtype", "int8")])
def test_launcher_and_workers_refuse_a_bad_value_with_the_same_sentence(flag, value):
    """`plan launch`'s flags have one definition (planner.launch_command.add_launch_flags): its workers refuse a bad
    value with the launcher's sentence, before any work."""
    from planner.launch_command import build_parser
    from runtime import train
    with pytest.raises(PlanError) as launcher:
        build_parser().parse_args(["p.json", flag, value])
    with pytest.raises(PlanError) as worker:
        train.parse_args(["--plan", "p.json", flag, value])
    assert str(launcher.value).split(" (see")[0] == str(worker.value).split(" (see")[0]


def test_torchrun_output_is_kept_unless_a_worker_reported(capsys):
    """run_torchrun with stand-ins for torchrun: output of an unknown failure is passed on with its exit code; a
    failure whose sentence was reported through the error file is that sentence alone, with the worker's code."""
    from runtime.launch import run_torchrun
    unknown = "import sys; sys.stderr.write('Traceback (most recent call last):\\nboom\\n'); sys.exit(3)"
    assert run_torchrun([sys.executable, "-c", unknown], dict(os.environ)) == 3
    assert capsys.readouterr().err == "Traceback (most recent call last):\nboom\n"
    reported = ("import os, sys; open(os.environ[sys.argv[1]], 'x').write('2\\nno layout fits\\n'); "
                "sys.stderr.write('Traceback (most recent call last):\\nChildFailedError\\n'); sys.exit(1)")
    assert run_torchrun([sys.executable, "-c", reported, WORKER_ERROR_FILE_ENV], dict(os.environ)) == 2
    assert capsys.readouterr().err == "plan: no layout fits\n"


def test_worker_error_is_one_sentence(tmp_path, capsys):
    """An error only the worker can find (a checkpoint of another model: DCP raises CheckpointException, a
    BaseException) ends in one sentence from the launcher, not in every rank's line above torchrun's traceback."""
    plan = str(write_plan(tmp_path / "p.json", tp=1, micro_batch=2, sharding="none"))
    _save_in_process(tmp_path / "ck", "gpt", 2)
    capsys.readouterr()
    assert main([plan, "--device", "cpu", "--nproc-per-node", "1", "--steps", "1", "--ckpt-dir",
                 str(tmp_path / "ck"), "--resume", "--results", str(tmp_path / "r.csv")]) == 1
    err = _one_sentence(capsys)
    assert err.startswith("plan: checkpoint") and "does not fit this model" in err


def test_resume_past_an_interrupted_save(tmp_path, capsys):
    """A run killed while saving step 4, after logging steps 3 and 4: resume takes step 2, the newest complete
    checkpoint, moves the half-written step 4 aside when it saves step 4 itself, and sets the interrupted run's
    rows 3 and 4 aside instead of doubling them in the step CSV."""
    plan = str(write_plan(tmp_path / "p.json", tp=1, micro_batch=2, sharding="none"))
    ck, results = tmp_path / "ck", tmp_path / "r.csv"
    _save_in_process(ck, "llama", 2)
    (ck / "step-00000004").mkdir()
    (ck / "step-00000004.partial").mkdir()
    results.write_text("step,loss\n1,5.5\n2,5.4\n3,5.3\n4,5.2\n")
    capsys.readouterr()
    assert main([plan, "--device", "cpu", "--nproc-per-node", "1", "--steps", "2", "--ckpt-dir", str(ck),
                 "--resume", "--results", str(results)]) == 0
    assert (ck / "latest").read_text().strip() == "4"
    assert (ck / "step-00000004" / ".metadata").is_file()
    assert (ck / "step-00000004.incomplete").is_dir() and (ck / "step-00000004.partial.incomplete").is_dir()
    with open(results, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["step"] for r in rows] == ["1", "2", "3", "4"] and rows[2]["loss"] != "5.3"
    assert (tmp_path / "r.superseded-after-step-2.csv").read_text() == "step,loss\n3,5.3\n4,5.2\n"


def _wait_for_rows(path, n, proc, timeout=90.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end and proc.poll() is None:
        if path.exists() and len(path.read_text().splitlines()) > n:
            return
        time.sleep(0.2)
    raise AssertionError(f"no {n} step rows in {path} (launch exited with {proc.poll()})")


def test_signal_to_plan_launch_stops_and_saves(tmp_path):
    """SIGTERM to the `plan launch` process (not torchrun) reaches the workers: they stop after the current step
    and save it, and the launch ends with one sentence naming the checkpoint."""
    plan = str(write_plan(tmp_path / "p.json", tp=1, micro_batch=2, sharding="none"))
    ck, results = tmp_path / "ck", tmp_path / "r.csv"
    argv = [plan, "--device", "cpu", "--nproc-per-node", "1", "--steps", "100000", "--ckpt-dir", str(ck),
            "--results", str(results)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", "import sys; from runtime.launch import main; "
                             "sys.exit(main(sys.argv[1:]))", *argv], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_rows(results, 2, proc)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err
    steps = len(_losses(results))
    assert 2 <= steps < 100000
    assert (ck / "latest").read_text().strip() == str(steps)
    assert (ck / f"step-{steps:08d}" / ".metadata").is_file()
    assert err.strip() == f"plan: stopped by SIGTERM; the newest checkpoint is '{ck}/step-{steps:08d}'", err


def _layout_plan(path, **lay):
    spec = tiny_model("llama")
    layout = Layout(**lay)
    plan = Plan(model=spec, cluster={"num_gpus": layout.world_size}, training=TrainingShape(32, 8), layout=layout,
                stages=even_stages(spec.num_layers, layout.pp * layout.vpp, "none"))
    path.write_text(json.dumps(plan.to_dict()))
    return path


@pytest.mark.parametrize("second", [dict(pp=2, dp=2, micro_batch=1, sharding="optimizer"),
                                    dict(dp=4, micro_batch=1, sharding="optimizer")], ids=["pp2xdp2", "dp4"])
def test_resume_under_another_layout_continues_its_curve(tmp_path, second):
    """Two steps under TP2 x DP2, saved, resumed under the second layout: every step's loss within 1e-6 of the second
    layout's own uninterrupted run (the checkpoint is resharded on load, the data order follows the step)."""
    first = _layout_plan(tmp_path / "tp2dp2.json", tp=2, dp=2, micro_batch=1, sharding="optimizer")
    other = _layout_plan(tmp_path / "other.json", **second)
    base = ["--device", "cpu", "--lr", "1e-3"]
    assert main([str(other), "--steps", "4", "--results", str(tmp_path / "ref.csv")] + base) == 0
    ck = str(tmp_path / "ck")
    assert main([str(first), "--steps", "2", "--results", str(tmp_path / "run.csv"), "--ckpt-dir", ck] + base) == 0
    assert main([str(other), "--steps", "2", "--results", str(tmp_path / "run.csv"), "--ckpt-dir", ck,
                 "--resume"] + base) == 0
    ref, run = _losses(tmp_path / "ref.csv"), _losses(tmp_path / "run.csv")
    assert len(ref) == len(run) == 4
    assert run == pytest.approx(ref, abs=1e-6)
