"""A worker that trains several plans in a row releases each plan's model and optimizer before the next
(the optimizer's hooks live in C++ autograd state, where a reference cycle would never be collected)."""
from __future__ import annotations

import csv
import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import runtime.train as T

REPO = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent('''
    import gc, sys, weakref
    import runtime.train as T
    import runtime.trainer.build as B
    from planner.cluster import ClusterSpec
    from planner.model import tiny_model
    from planner.plan import TrainingShape
    from planner.profile import load_profile
    from planner.search import Pins, search
    out = sys.argv[1]
    plan = search(tiny_model("gpt"), TrainingShape(32, 4), ClusterSpec(gpu="h200-sxm", num_gpus=1, gpus_per_node=1),
                  load_profile("h200-sxm", "h200-sxm"), Pins(micro_batch=2), top_k=1).plans[0]
    plan.save(out + "/a.json")
    plan.save(out + "/b.json")
    refs = []
    build = B.build_optimizer
    def spy(stages, *a, **k):
        opt = build(stages, *a, **k)
        refs.extend([weakref.ref(stages[0]), weakref.ref(opt)])
        return opt
    B.build_optimizer = spy
    assert T.main(["--plan", out + "/a.json", out + "/b.json", "--steps", "2", "--device", "cpu", "--results", out,
                   "--components-out", out]) == 0
    gc.collect()
    print("alive", sum(r() is not None for r in refs), "of", len(refs))
''')


def test_plans_in_one_worker_free_their_memory(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=str(REPO), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0",
               WORLD_SIZE="1", LOCAL_RANK="0", OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True, env=env,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    assert "alive 0 of 4" in p.stdout, p.stdout
    assert (tmp_path / "a.done").exists() and (tmp_path / "b.done").exists()
    assert (tmp_path / "a.csv").read_text().count("\n") == 3  # header + 2 steps
    for stem in "ab":   # with several plans --components-out is a folder: one record per plan (CPU: the marker)
        assert json.loads((tmp_path / f"{stem}.components.json").read_text())["reason"] == T.NOT_TRACED_ON_CPU


EXTRA_STEP_SCRIPT = textwrap.dedent('''
    import json, os, socket, sys
    import runtime.train as T
    import runtime.trainer.loop as L
    from planner.cluster import ClusterSpec
    from planner.model import tiny_model
    from planner.plan import TrainingShape
    from planner.profile import load_profile
    from planner.search import Pins, search
    out = sys.argv[1]
    plan = search(tiny_model("gpt"), TrainingShape(32, 4), ClusterSpec(gpu="h200-sxm", num_gpus=1, gpus_per_node=1),
                  load_profile("h200-sxm", "h200-sxm"), Pins(micro_batch=2), top_k=1).plans[0]
    plan.save(out + "/p.json")
    write = L.write_step_components
    seen = []
    def run_it_on_cpu(path, cuda, step, run_step):
        loss, _ = run_step()  # on CPU the worker runs no extra step; here it does, as on CUDA
        seen.append([step, float(loss)])
        write(path, cuda, step, run_step)
    L.write_step_components = run_it_on_cpu
    def run(*extra):
        with socket.socket() as s:  # a fresh rendezvous port per run of the worker in this process
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
        assert T.main(["--plan", out + "/p.json", "--device", "cpu", *extra]) == 0
    run("--steps", "3", "--results", out + "/a.csv")
    run("--steps", "2", "--results", out + "/b.csv", "--ckpt-dir", out + "/ck", "--components-out", out + "/c.json")
    run("--steps", "1", "--results", out + "/b.csv", "--ckpt-dir", out + "/ck", "--resume")
    print("seen", json.dumps(seen))
''')


def _losses(path):
    with open(path, newline="") as fh:
        return [(int(r["step"]), float(r["loss"])) for r in csv.DictReader(fh)]


def test_extra_traced_step_stays_out_of_the_csv_and_the_checkpoint(tmp_path):
    """--components-out runs one step more than --steps: after the exit checkpoint and without a CSV row, so the
    step statistics never see it and a resumed run continues from the checkpoint as if it had not run."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=str(REPO), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0",
               WORLD_SIZE="1", LOCAL_RANK="0", OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-c", EXTRA_STEP_SCRIPT, str(tmp_path)], capture_output=True, text=True,
                       env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    (seen,) = [json.loads(ln.split(" ", 1)[1]) for ln in p.stdout.splitlines() if ln.startswith("seen ")]
    a, b = _losses(tmp_path / "a.csv"), _losses(tmp_path / "b.csv")
    assert [s for s, _ in a] == [s for s, _ in b] == [1, 2, 3]
    assert [step for step, _ in seen] == [3]            # the extra step is step 3, run once, after steps 1-2
    assert seen[0][1] == pytest.approx(a[2][1], abs=2e-6)  # the next step's data, from step 2's state
    assert b[2][1] == pytest.approx(a[2][1], abs=2e-6)   # the resumed step 3: the checkpoint held step 2
    assert json.loads((tmp_path / "c.json").read_text()) == {"traced": False, "reason": T.NOT_TRACED_ON_CPU}
