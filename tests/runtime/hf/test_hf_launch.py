"""`plan launch --init-from DIR --save-hf DIR` as a user runs it: a tiny Llama made with transformers is planned from
its config.json, loaded into a TP2 x DP2 plan on CPU, trained 3 steps and written back, and transformers loads the
result with no key missing or unexpected. The loaded weights are the checkpoint's under every layout (the first
step's loss is the same at TP2 x DP2 and at DP4, and differs from a run from random weights), and the launcher
refuses bad Hugging Face flags in one sentence before any worker starts. (tests/runtime/hf/test_hf_weights.py checks
the numbers against transformers' forward per model type.)"""
from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from runtime.launch import main  # noqa: E402
from tests.runtime.hf import hf_models  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]


def _plan(tmp_path: Path, folder: Path, name: str, **degrees) -> Path:
    out = tmp_path / f"{name}.json"
    pins = [f"--{k}={v}" for k, v in degrees.items()]
    cmd = [sys.executable, "-m", "planner.cli", "--model", str(folder / "config.json"), "--gpus", "4",
           "--gpus-per-node", "4", "--pp", "1", "--seq-len", "16", "--global-batch", "4", "--micro-batch", "1",
           *pins, "-o", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert p.returncode == 0, p.stderr
    return out


def _launch(plan: Path, *flags) -> int:
    return main([str(plan), "--device", "cpu", "--steps", "3", "--timeout", "240", *map(str, flags)])


def _losses(results: Path) -> list[float]:
    with open(results) as f:
        return [float(r["loss"]) for r in csv.DictReader(f)]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hf") / "llama"
    hf_models.make_hf_model("llama", folder)
    return folder


def test_init_from_train_save_hf_and_transformers_loads_it(tmp_path, llama):
    import transformers
    plan = _plan(tmp_path, llama, "tp2dp2", tp=2, dp=2)
    out = tmp_path / "trained"
    assert _launch(plan, "--init-from", llama, "--save-hf", out, "--results", tmp_path / "a.csv") == 0
    model, info = transformers.AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    start = transformers.AutoModelForCausalLM.from_pretrained(llama)
    trained, initial = dict(model.named_parameters()), dict(start.named_parameters())
    assert trained.keys() == initial.keys()
    assert any(not torch.equal(trained[n].float(), initial[n].float()) for n in trained), "3 steps changed nothing"

    # the same checkpoint under another layout starts from the same loss; random weights do not
    dp4 = _plan(tmp_path, llama, "dp4", tp=1, dp=4)
    assert _launch(dp4, "--init-from", llama, "--results", tmp_path / "b.csv") == 0
    assert _launch(dp4, "--results", tmp_path / "c.csv") == 0
    a, b, c = (_losses(tmp_path / f"{x}.csv") for x in "abc")
    assert abs(a[0] - b[0]) < 1e-4, (a, b)
    assert abs(a[0] - c[0]) > 1e-3, (a, c)


def test_bad_hf_flags_are_one_sentence_and_start_nothing(tmp_path, llama, capsys):
    plan = _plan(tmp_path, llama, "tp2dp2", tp=2, dp=2)
    cases = [
        (["--save-hf", tmp_path / "x"], "--save-hf needs the model's Hugging Face config.json"),
        (["--hf-config", llama / "config.json"], "--hf-config is the config --save-hf writes"),
        (["--init-from", tmp_path / "nowhere"], "does not exist or is not a folder"),
        (["--init-from", llama, "--save-hf", llama], "exists already"),
    ]
    for flags, words in cases:
        assert _launch(plan, *flags, "--results", tmp_path / "r.csv") == 1
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and "Traceback" not in err, err
        assert words in err, err
        assert not (tmp_path / "r.csv").exists() and not (tmp_path / "x").exists()


def test_weights_under_more_tp_ranks_than_kv_heads_are_refused(tmp_path, llama, capsys):
    plan = _plan(tmp_path, llama, "tp4", tp=4, dp=1)  # the tiny Llama has 2 KV heads: replicated over TP 4
    assert _launch(plan, "--init-from", llama, "--results", tmp_path / "r.csv") == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "with 2 KV head(s)" in err and "use TP <= 2" in err, err


def test_a_plan_records_its_model_type_and_an_approximated_type_is_not_launched(tmp_path, llama, capsys):
    """`plan --model config.json` records the config's model_type in the plan's model; a phi plan (planned as a
    GPT-style model, with the planner's warning) is refused by `plan launch` in one sentence, with or without
    --init-from, and nothing is started or written."""
    import json
    assert json.loads(_plan(tmp_path, llama, "llama", tp=2, dp=2).read_text())["model"]["hf_model_type"] == "llama"
    phi = tmp_path / "phi"
    phi.mkdir()
    (phi / "config.json").write_text(json.dumps({
        "model_type": "phi", "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4,
        "num_hidden_layers": 2, "vocab_size": 300, "max_position_embeddings": 64, "hidden_act": "gelu_new"}))
    cmd = [sys.executable, "-m", "planner.cli", "--model", str(phi / "config.json"), "--gpus", "4", "--gpus-per-node",
           "4", "--pp", "1", "--seq-len", "16", "--global-batch", "4", "--micro-batch", "1", "--tp", "2", "--dp", "2",
           "-o", str(tmp_path / "phi.json")]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert p.returncode == 0 and "model_type 'phi' has a plain GELU MLP" in p.stderr, p.stderr
    plan = tmp_path / "phi.json"
    assert json.loads(plan.read_text())["model"]["hf_model_type"] == "phi"
    for flags in ([], ["--init-from", phi]):
        assert _launch(plan, *flags, "--results", tmp_path / "r.csv", "--ckpt-dir", tmp_path / "ck") == 1
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and "Traceback" not in err, err
        assert err == ("plan: model_type 'phi' is planned with an approximated architecture that parallel-plan's "
                       "runtime does not build exactly (its positions, residual wiring or norms differ), so "
                       "`plan launch` refuses to train it"), err
        assert not (tmp_path / "r.csv").exists() and not (tmp_path / "ck").exists()
