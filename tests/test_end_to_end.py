"""The whole loop on CPU, as a user runs it: profile this machine -> plan with that profile -> launch the
plan and compare the measured step with the prediction (plan validate). Gloo, two processes, a tiny model."""
import csv
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def plan_cmd(*args, timeout=300):
    env = dict(os.environ, PYTHONPATH=str(REPO), COLUMNS="200", OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-m", "planner.cli", *map(str, args)], capture_output=True, text=True,
                       cwd=REPO, env=env, timeout=timeout)
    assert p.returncode == 0, (args, p.stdout[-2000:], p.stderr[-2000:])
    assert "Traceback" not in p.stderr
    return p.stdout


def test_profile_plan_validate_on_cpu(tmp_path):
    cfg = tmp_path / "tiny" / "config.json"
    cfg.parent.mkdir()
    cfg.write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 64,
                               "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
                               "vocab_size": 256, "max_position_embeddings": 64}))
    prof = tmp_path / "cpu-profile.json"
    plan_cmd("profile", "--device", "cpu", "--quick", "--gpus", "2", "--out", prof, "--no-progress")
    assert json.loads(prof.read_text())["format"] == "parallel-plan/profile"

    plan = tmp_path / "plan.json"
    out = plan_cmd("--model", cfg, "--gpus", "2", "--gpu", "cpu", "--profile", prof, "--seq-len", "32",
                   "--global-batch", "4", "--json", "-o", plan)
    best = json.loads(out)["plans"][0]
    assert best["layout"]["tp"] * best["layout"]["pp"] * best["layout"]["dp"] * best["layout"]["cp"] == 2
    assert best["provenance"]["profile"] == str(prof)

    results = tmp_path / "results.csv"
    plan_cmd("validate", plan, "--device", "cpu", "--steps", "4", "--warmup", "1", "--profile", prof,
             "--append", results, timeout=600)
    rows = list(csv.DictReader(results.open()))
    assert len(rows) == 1
    row = rows[0]
    assert float(row["measured_step_s"]) > 0 and float(row["predicted_step_s"]) > 0
    assert int(row["gpus"]) == 2 and row["model"] == "tiny"
