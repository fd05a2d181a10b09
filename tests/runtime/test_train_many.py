"""A worker that trains several plans in a row releases each plan's model and optimizer before the next
(the optimizer's hooks live in C++ autograd state, where a reference cycle would never be collected)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent('''
    import gc, sys, weakref
    import runtime.train as T
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
    build = T.build_optimizer
    def spy(stages, *a, **k):
        opt = build(stages, *a, **k)
        refs.extend([weakref.ref(stages[0]), weakref.ref(opt)])
        return opt
    T.build_optimizer = spy
    assert T.main(["--plan", out + "/a.json", out + "/b.json", "--steps", "2", "--device", "cpu", "--results", out]) == 0
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
