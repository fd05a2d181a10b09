"""Bad input over all seven subcommands, table-driven: each case must exit with its code, print exactly one line
on stderr (`plan: ...`), no traceback, and leave the folder it ran in exactly as it was (nothing written, nothing
changed). Cases run in-process through planner.cli.main; none reaches torchrun (the launch and validate cases are
refused by their checks before it)."""
from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import pytest

from planner.cli import main
from planner.cluster import ClusterSpec
from planner.model import tiny_model
from planner.plan import Layout, Plan, TrainingShape, even_stages
from planner.calibrate import RESULT_COLUMNS
from tests.planner.conftest import run_cli


def tiny_plan(name: str = "tiny-llama") -> Plan:
    model = replace(tiny_model("llama"), name=name)
    return Plan(model=model, cluster=ClusterSpec(gpu="h200-sxm", num_gpus=1, gpus_per_node=1).to_dict(),
                training=TrainingShape(seq_len=32, global_batch=4), layout=Layout(sharding="none"),
                stages=even_stages(model.num_layers, 1))


def _dump(path: Path, d) -> None:
    path.write_text(json.dumps(d))


def _tampered(edit) -> dict:
    d = json.loads(json.dumps(tiny_plan().to_dict()))
    edit(d)
    return d


LLAMA_CFG = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
             "num_key_value_heads": 2, "num_hidden_layers": 4, "vocab_size": 256, "max_position_embeddings": 64,
             "hidden_act": "silu"}
CONFIGS = {
    "t5": {"model_type": "t5", "d_model": 512, "num_layers": 6, "num_heads": 8, "vocab_size": 32128,
           "is_encoder_decoder": True},
    "mamba": {"model_type": "mamba", "hidden_size": 768, "num_hidden_layers": 24, "vocab_size": 50280,
              "state_size": 16},
    "gemma2": dict(LLAMA_CFG, model_type="gemma2", attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                   hidden_activation="gelu_pytorch_tanh"),
    "gemma3": dict(LLAMA_CFG, model_type="gemma3_text", hidden_activation="gelu_pytorch_tanh"),
    "gemma": dict(LLAMA_CFG, model_type="gemma", hidden_act="gelu", hidden_activation="relu"),
    "newarch": dict(LLAMA_CFG, model_type="newarch"),
    "huge": dict(LLAMA_CFG, num_hidden_layers=1e12),
    "halflayer": dict(LLAMA_CFG, num_hidden_layers=4.5),
    "nanrope": dict(LLAMA_CFG, rope_theta=float("nan")),
    "mlpbias": dict(LLAMA_CFG, mlp_bias=True),
    "partialrope": dict(LLAMA_CFG, model_type="phi3", partial_rotary_factor=0.75),
    "stringtie": dict(LLAMA_CFG, tie_word_embeddings="false"),
    "stringbias": dict(LLAMA_CFG, attention_bias="no"),
    "bart": {"model_type": "bart", "d_model": 768, "encoder_layers": 6, "decoder_layers": 6, "vocab_size": 50265},
}


def setup_files(t: Path) -> None:
    """The inputs the cases refer to, written before the snapshot."""
    tiny_plan().save(t / "plan.json")
    bad = {
        "nolayout_mb": lambda d: d["layout"].pop("micro_batch"),
        "nolayout_sharding": lambda d: d["layout"].pop("sharding"),
        "notraining": lambda d: d.pop("training"),
        "badtype": lambda d: d["layout"].update(tp="2"),
        "booltp": lambda d: d["layout"].update(tp=True),
        "nanpred": lambda d: d.update(prediction={"step_s": float("nan"), "tokens_per_s": 1.0, "tflops_per_gpu": 1.0,
                                                  "mfu": 0.1, "memory_gib_per_rank": [1.0], "memory_limit_gib": 100.0,
                                                  "breakdown_s": {}}),
        "newline_name": lambda d: d["model"].update(name="x\ntouch pwned"),
        "subst_name": lambda d: d["model"].update(name="x$(touch pwned)"),
        "huge_layers": lambda d: d["model"].update(num_layers=10 ** 12),
        "nanseq": lambda d: d["training"].update(seq_len=float("nan")),
        "stage_missing": lambda d: d["stages"][0].pop("full_recompute_layers"),
        "cluster_nan": lambda d: d["cluster"].update(inter_node_gb_per_s=float("nan")),
    }
    for name, edit in bad.items():
        _dump(t / f"{name}.json", _tampered(edit))
    (t / "notjson.json").write_text("{not json")
    for name, cfg in CONFIGS.items():
        (t / name).mkdir()
        _dump(t / name / "config.json", cfg)
    (t / "outdir").mkdir()
    (t / "datadir").mkdir()
    (t / "existing.sh").write_text("#!/bin/bash\necho mine\n")
    (t / "existing.json").write_text("{}")
    (t / "report").mkdir()
    (t / "report" / "report.md").write_text("my notes\n")
    (t / "report2").mkdir()
    (t / "report2" / "throughput.png").write_bytes(b"\x89PNG mine")
    (t / "foreign.csv").write_text("a,b\n1,2\n")
    (t / "empty.csv").write_text(",".join(RESULT_COLUMNS) + "\n")
    (t / "notes.txt").write_text("notes")
    _dump(t / "cluster_nan.cluster.json", {"gpu": "h200-sxm", "num_gpus": 8, "gpus_per_node": 8,
                                           "inter_node_gb_per_s": float("nan")})
    _dump(t / "cluster_big.cluster.json", {"gpu": "h200-sxm", "num_gpus": 2 ** 30, "gpus_per_node": 8})
    _dump(t / "cluster_ok.cluster.json", {"gpu": "h200-sxm", "num_gpus": 8, "gpus_per_node": 8,
                                          "inter_node_gb_per_s": 50.0})
    _dump(t / "cluster_latency.cluster.json", {"gpu": "h200-sxm", "num_gpus": 8, "gpus_per_node": 8,
                                               "inter_node_latency_us": 2.0})


M = ["--model", "gpt-1.3b"]
CASES = [
    # -- plan (search) ----------------------------------------------------------------------------------------
    ("plan gpus nan", [*M, "--gpus", "nan"], 1, "--gpus must be a whole number"),
    ("plan gpus huge", [*M, "--gpus", "1073741824"], 1, "--gpus must be at most 131072"),
    ("plan gpus negative", [*M, "--gpus", "-8"], 1, "--gpus must be at least 1"),
    ("plan inter-node nan", [*M, "--gpus", "8", "--inter-node-gbps", "nan"], 1, "--inter-node-gbps must be a finite"),
    ("plan inter-node inf", [*M, "--gpus", "8", "--inter-node-gbps", "inf"], 1, "--inter-node-gbps must be a finite"),
    ("plan inter-node negative", [*M, "--gpus", "8", "--inter-node-gbps", "-1"], 1, "--inter-node-gbps must be above 0"),
    ("plan inter-node huge", [*M, "--gpus", "8", "--inter-node-gbps", "1e9"], 1, "--inter-node-gbps must be at most"),
    ("plan headroom nan", [*M, "--gpus", "8", "--headroom-gib", "nan"], 1, "--headroom-gib must be a finite"),
    ("plan headroom negative", [*M, "--gpus", "8", "--headroom-gib", "-3"], 1, "--headroom-gib must be at least 0"),
    ("plan seq-len zero", [*M, "--gpus", "8", "--seq-len", "0"], 1, "--seq-len must be at least 1"),
    ("plan seq-len huge", [*M, "--gpus", "8", "--seq-len", "99999999999"], 1, "--seq-len must be at most"),
    ("plan global-batch huge", [*M, "--gpus", "8", "--global-batch", "1e30"], 1, "--global-batch must be a whole"),
    ("plan tp text", [*M, "--gpus", "8", "--tp", "two"], 1, "--tp must be a whole number"),
    ("plan tp not dividing", [*M, "--gpus", "8", "--tp", "3"], 1, "tp 3 = 3 does not divide the 8 GPUs"),
    ("plan dp and batch", [*M, "--gpus", "8", "--dp", "8", "--global-batch", "12"], 1,
     "global batch 12 is not a multiple of dp 8"),
    ("plan dp mb and batch", [*M, "--gpus", "8", "--dp", "4", "--micro-batch", "2", "--global-batch", "12"], 1,
     "not a multiple of dp 4 x micro-batch 2 = 8"),
    ("plan all pinned", [*M, "--gpus", "16", "--tp", "2", "--pp", "2", "--dp", "2", "--cp", "1"], 1,
     "= 8 GPUs, not the 16 asked for"),
    ("plan top huge", [*M, "--gpus", "8", "--top", "100000"], 1, "--top must be at most 1000"),
    ("plan unknown model", ["--model", "gpt-7", "--gpus", "8"], 1, "unknown model 'gpt-7'"),
    ("plan no-overlap bad", [*M, "--gpus", "8", "--no-overlap", "xx"], 1, "--no-overlap takes tp, dp, pp and ep"),
    ("plan out proc", [*M, "--gpus", "8", "-o", "/proc/x.json"], 1, "cannot be written"),
    ("plan out missing dir", [*M, "--gpus", "8", "-o", "missing/dir/x.json"], 1, "'missing/dir' does not exist"),
    ("plan out dir", [*M, "--gpus", "8", "-o", "outdir"], 1, "'outdir' is a folder"),
    ("plan out dir force", [*M, "--gpus", "8", "-o", "outdir", "--force"], 1, "'outdir' is a folder"),
    ("plan out exists", [*M, "--gpus", "8", "-o", "existing.json"], 1, "already exists; pass --force"),
    ("plan other gpu profile", [*M, "--gpus", "8", "--profile", "h100-sxm"], 1,
     "measured on h100-sxm, but the plan is for h200-sxm"),
    ("plan cluster nan", [*M, "--cluster", "cluster_nan.cluster.json"], 1, "inter-node bandwidth must be a positive"),
    ("plan cluster huge", [*M, "--cluster", "cluster_big.cluster.json"], 1, "GPU count must be a whole number from 1"),
    ("plan cluster latency", [*M, "--cluster", "cluster_latency.cluster.json"], 1,
     "inter_node_latency_us 2.0 is not used by the planner"),
    ("plan cluster and another gpu", [*M, "--cluster", "cluster_ok.cluster.json", "--gpu", "h100-sxm"], 1,
     "--gpu h100-sxm differs from the gpu h200-sxm of the cluster file 'cluster_ok.cluster.json'"),
    ("plan cluster and another network", [*M, "--cluster", "cluster_ok.cluster.json", "--inter-node-gbps", "25"], 1,
     "--inter-node-gbps 25 differs from the inter_node_gb_per_s 50 of the cluster file"),
    ("scaling cluster and other gpus per node", ["scaling", *M, "--gpus", "8,16", "--cluster", "cluster_ok.cluster.json",
                                                 "--gpus-per-node", "4", "-o", "new"], 1,
     "--gpus-per-node 4 differs from the gpus_per_node 8 of the cluster file"),
    ("plan hf t5", ["--model", "t5", "--gpus", "8"], 1, "model_type 't5' is an encoder-decoder model"),
    ("plan hf bart", ["--model", "bart", "--gpus", "8"], 1, "model_type 'bart' is an encoder-decoder model"),
    ("plan hf mamba", ["--model", "mamba", "--gpus", "8"], 1, "state-space (recurrent) layers, which are not attention"),
    ("plan hf gemma2", ["--model", "gemma2", "--gpus", "8"], 1, "attn_logit_softcapping 50.0 soft-caps logits"),
    ("plan hf gemma3", ["--model", "gemma3", "--gpus", "8"], 1, "extra norms before and after each feed-forward"),
    ("plan hf gemma relu", ["--model", "gemma", "--gpus", "8"], 1, "its MLP uses the activation 'relu'"),
    ("plan hf newarch", ["--model", "newarch", "--gpus", "8"], 1, "model_type 'newarch' is not one parallel-plan builds"),
    ("plan hf huge layers", ["--model", "huge", "--gpus", "8"], 1, "num_hidden_layers 1000000000000.0 is outside 1..4096"),
    ("plan hf half layer", ["--model", "halflayer", "--gpus", "8"], 1, "num_hidden_layers must be a whole number"),
    ("plan hf nan rope", ["--model", "nanrope", "--gpus", "8"], 1, "rope_theta must be a finite number"),
    ("plan hf mlp bias", ["--model", "mlpbias", "--gpus", "8"], 1, "mlp_bias true puts biases on the gated MLP"),
    ("plan hf partial rotary", ["--model", "partialrope", "--gpus", "8"], 1,
     "partial_rotary_factor 0.75 rotates part of each head"),
    ("plan hf string tie", ["--model", "stringtie", "--gpus", "8"], 1,
     "tie_word_embeddings must be true or false, got 'false'"),
    ("plan hf string bias", ["--model", "stringbias", "--gpus", "8"], 1, "attention_bias must be true or false"),
    ("plan hf missing", ["--model", "datadir", "--gpus", "8"], 1, "does not exist"),
    # -- export -----------------------------------------------------------------------------------------------
    ("export no to", ["export", "plan.json"], 1, "the following arguments are required: --to"),
    ("export bad to", ["export", "plan.json", "--to", "bash"], 1, "invalid choice: 'bash'"),
    ("export missing plan", ["export", "nope.json", "--to", "slurm"], 1, "plan file 'nope.json' does not exist"),
    ("export not json", ["export", "notjson.json", "--to", "slurm"], 1, "is not readable JSON"),
    ("export no micro_batch", ["export", "nolayout_mb.json", "--to", "megatron"], 1, "lacks the field 'layout.micro_batch'"),
    ("export no sharding", ["export", "nolayout_sharding.json", "--to", "slurm"], 1, "lacks the field 'layout.sharding'"),
    ("export no training", ["export", "notraining.json", "--to", "torchrun"], 1, "lacks the field 'training'"),
    ("export tp string", ["export", "badtype.json", "--to", "torchrun"], 1, "layout.tp must be a whole number"),
    ("export tp bool", ["export", "booltp.json", "--to", "torchrun"], 1, "layout.tp must be a whole number"),
    ("export nan prediction", ["export", "nanpred.json", "--to", "megatron"], 1, "prediction.step_s must be a finite"),
    ("export newline name slurm", ["export", "newline_name.json", "--to", "slurm"], 1, "has the model name 'x\\ntouch pwned'"),
    ("export newline name megatron", ["export", "newline_name.json", "--to", "megatron"], 1, "which is not 1 to 128"),
    ("export subst name torchrun", ["export", "subst_name.json", "--to", "torchrun"], 1, "'x$(touch pwned)'"),
    ("export huge layers", ["export", "huge_layers.json", "--to", "megatron"], 1, "model.num_layers must be a whole"),
    ("export nan seq", ["export", "nanseq.json", "--to", "megatron"], 1, "training.seq_len must be a whole number"),
    ("export stage key", ["export", "stage_missing.json", "--to", "megatron"], 1,
     "lacks the field 'stages[0].full_recompute_layers'"),
    ("export cluster nan", ["export", "cluster_nan.json", "--to", "megatron"], 1, "inter-node bandwidth must be"),
    ("export job name space", ["export", "plan.json", "--to", "slurm", "--job-name", "a b"], 1, "--job-name 'a b' is not"),
    ("export job name newline", ["export", "plan.json", "--to", "slurm", "--job-name", "a\ntouch x"], 1,
     "--job-name 'a\\ntouch x' is not"),
    ("export partition subst", ["export", "plan.json", "--to", "slurm", "--partition", "$(touch x)"], 1,
     "--partition '$(touch x)' is not"),
    ("export account semicolon", ["export", "plan.json", "--to", "slurm", "--account", "a;touch x"], 1, "--account"),
    ("export time words", ["export", "plan.json", "--to", "slurm", "--time", "1 hour"], 1, "is not a Slurm time limit"),
    ("export time newline", ["export", "plan.json", "--to", "slurm", "--time", "01:00:00\ntouch x"], 1,
     "is not a Slurm time limit"),
    ("export out dir force", ["export", "plan.json", "--to", "slurm", "-o", "outdir", "--force"], 1, "'outdir' is a folder"),
    ("export out missing", ["export", "plan.json", "--to", "slurm", "-o", "missing/dir/x.sh"], 1, "does not exist"),
    ("export out proc", ["export", "plan.json", "--to", "slurm", "-o", "/proc/x.sh"], 1, "cannot be written"),
    ("export out exists", ["export", "plan.json", "--to", "slurm", "-o", "existing.sh"], 1, "already exists"),
    ("export steps zero", ["export", "plan.json", "--to", "torchrun", "--steps", "0"], 1, "--steps must be at least 1"),
    ("export nodes split", ["export", "plan.json", "--to", "slurm", "--nodes", "3"], 1, "do not split evenly over 3"),
    ("export lr nan", ["export", "plan.json", "--to", "torchrun", "--lr", "nan"], 1, "--lr must be a positive number"),
    ("export node-rank negative", ["export", "plan.json", "--to", "torchrun", "--node-rank", "-1"], 1,
     "--node-rank must be at least 0"),
    # -- launch (refused before torchrun) ---------------------------------------------------------------------
    ("launch peak-tflops negative", ["launch", "plan.json", "--device", "cpu", "--peak-tflops", "-1"], 1,
     "--peak-tflops must be above 0"),
    ("launch peak-tflops nan", ["launch", "plan.json", "--device", "cpu", "--peak-tflops", "nan"], 1,
     "--peak-tflops must be a finite"),
    ("launch steps zero", ["launch", "plan.json", "--device", "cpu", "--steps", "0"], 1, "--steps must be at least 1"),
    ("launch steps text", ["launch", "plan.json", "--device", "cpu", "--steps", "ten"], 1, "--steps must be a whole"),
    ("launch save-every negative", ["launch", "plan.json", "--device", "cpu", "--save-every", "-2"], 1,
     "--save-every must be at least 0"),
    ("launch nnodes zero", ["launch", "plan.json", "--device", "cpu", "--nnodes", "0"], 1, "--nnodes must be at least 1"),
    ("launch data dir", ["launch", "plan.json", "--device", "cpu", "--data", "datadir"], 1,
     "data source 'datadir' is a folder; --data takes a flat token file"),
    ("launch data missing", ["launch", "plan.json", "--device", "cpu", "--data", "nope.bin"], 1, "does not exist"),
    ("launch no micro_batch", ["launch", "nolayout_mb.json", "--device", "cpu", "--dry-run"], 1,
     "lacks the field 'layout.micro_batch'"),
    ("launch newline name", ["launch", "newline_name.json", "--device", "cpu", "--dry-run"], 1, "has the model name"),
    ("launch results dir", ["launch", "plan.json", "--device", "cpu", "--results", "outdir"], 1, "is a folder"),
    ("launch results missing dir", ["launch", "plan.json", "--device", "cpu", "--results", "missing/r.csv"], 1,
     "does not exist"),
    ("launch unknown flag", ["launch", "plan.json", "--device", "cpu", "--stpes", "3"], 1, "unrecognized arguments"),
    ("launch bad device", ["launch", "plan.json", "--device", "tpu"], 1, "invalid choice: 'tpu'"),
    # -- validate (refused before torchrun) -------------------------------------------------------------------
    ("validate timeout negative", ["validate", "plan.json", "--device", "cpu", "--timeout", "-5"], 1,
     "--timeout must be at least 0"),
    ("validate timeout nan", ["validate", "plan.json", "--device", "cpu", "--timeout", "nan"], 1,
     "--timeout must be a finite"),
    ("validate steps vs warmup", ["validate", "plan.json", "--device", "cpu", "--steps", "3", "--warmup", "3"], 1,
     "--steps (3) must exceed --warmup (3)"),
    ("validate warmup negative", ["validate", "plan.json", "--device", "cpu", "--warmup", "-1"], 1,
     "--warmup must be at least 0"),
    ("validate append foreign", ["validate", "plan.json", "--device", "cpu", "--append", "foreign.csv"], 1,
     "has other columns than a validation results CSV"),
    ("validate append missing dir", ["validate", "plan.json", "--device", "cpu", "--append", "missing/r.csv"], 1,
     "does not exist"),
    ("validate append dir", ["validate", "plan.json", "--device", "cpu", "--append", "outdir"], 1, "is a folder"),
    ("validate other gpu profile", ["validate", "plan.json", "--device", "cpu", "--profile", "h100-sxm"], 1,
     "measured on h100-sxm, but the plan is for h200-sxm"),
    ("validate no micro_batch", ["validate", "nolayout_mb.json", "--device", "cpu"], 1, "lacks the field"),
    ("validate missing plan", ["validate", "nope.json", "--device", "cpu"], 1, "does not exist"),
    # -- profile ----------------------------------------------------------------------------------------------
    ("profile budget nan", ["profile", "--device", "cpu", "--budget", "nan"], 1, "--budget must be a finite"),
    ("profile budget negative", ["profile", "--device", "cpu", "--budget", "-1"], 1, "--budget must be above 0"),
    ("profile gpus zero", ["profile", "--device", "cpu", "--gpus", "0"], 1, "--gpus must be at least 1"),
    ("profile gpus huge", ["profile", "--device", "cpu", "--gpus", "1073741824"], 1, "--gpus must be at most 1024"),
    ("profile nic nan", ["profile", "--device", "cpu", "--nic-gbps", "nan"], 1, "--nic-gbps must be a finite"),
    ("profile out missing dir", ["profile", "--device", "cpu", "--out", "missing/dir/p.json"], 1,
     "'missing/dir' does not exist"),
    ("profile out dir", ["profile", "--device", "cpu", "--out", "outdir", "--force"], 1, "'outdir' is a folder"),
    ("profile out proc", ["profile", "--device", "cpu", "--out", "/proc/p.json"], 1, "cannot be written"),
    ("profile out exists", ["profile", "--device", "cpu", "--out", "existing.json"], 1, "already exists"),
    ("profile bad device", ["profile", "--device", "tpu"], 1, "invalid choice: 'tpu'"),
    # -- calibrate --------------------------------------------------------------------------------------------
    ("calibrate missing results", ["calibrate", "nope.csv", "--profile", "h200-sxm", "-o", "c.json"], 1,
     "results file 'nope.csv' does not exist"),
    ("calibrate foreign results", ["calibrate", "foreign.csv", "--profile", "h200-sxm", "-o", "c.json"], 1,
     "does not have the results columns"),
    ("calibrate holdout nan", ["calibrate", "empty.csv", "--profile", "h200-sxm", "-o", "c.json",
                               "--holdout-fraction", "nan"], 1, "--holdout-fraction must be in (0, 1)"),
    ("calibrate grid zero", ["calibrate", "empty.csv", "--profile", "h200-sxm", "-o", "c.json", "--grid-step", "0"], 1,
     "--grid-step must be in (0, 0.5]"),
    ("calibrate bad terms", ["calibrate", "empty.csv", "--profile", "h200-sxm", "-o", "c.json", "--terms", "warp"], 1,
     "unknown efficiency term(s) warp"),
    ("calibrate missing profile", ["calibrate", "empty.csv", "--profile", "nope.json", "-o", "c.json"], 1,
     "does not exist"),
    ("calibrate too few rows", ["calibrate", "empty.csv", "--profile", "h200-sxm", "-o", "c.json"], 1,
     "calibration needs at least 2"),
    ("calibrate no output", ["calibrate", "empty.csv", "--profile", "h200-sxm"], 1,
     "the following arguments are required: -o/--output"),
    # -- scaling ----------------------------------------------------------------------------------------------
    ("scaling report exists", ["scaling", *M, "--gpus", "8", "-o", "report"], 1,
     "'report/report.md' already exists; pass --force"),
    ("scaling png exists", ["scaling", *M, "--gpus", "8", "-o", "report2"], 1,
     "'report2/throughput.png' already exists"),
    ("scaling out file", ["scaling", *M, "--gpus", "8", "-o", "notes.txt"], 1, "exists and is not a folder"),
    ("scaling out missing parent", ["scaling", *M, "--gpus", "8", "-o", "missing/dir/x"], 1,
     "cannot be created: 'missing/dir' does not exist"),
    ("scaling out proc", ["scaling", *M, "--gpus", "8", "-o", "/proc/x"], 1, "cannot be written"),
    ("scaling gpus zero", ["scaling", *M, "--gpus", "0,8", "-o", "new"], 1, "--gpus takes positive GPU counts"),
    ("scaling inter-node inf", ["scaling", *M, "--gpus", "8", "--inter-node-gbps", "inf", "-o", "new"], 1,
     "--inter-node-gbps must be a finite"),
    ("scaling batch both", ["scaling", *M, "--gpus", "8", "--global-batch", "64", "--batch-per-gpu", "2", "-o", "new"],
     1, "either --global-batch or --batch-per-gpu"),
    ("scaling compare profile alone", ["scaling", *M, "--gpus", "8", "--compare-profile", "h100-sxm", "-o", "new"], 1,
     "--compare-profile needs --compare-gpu"),
    ("scaling tokens negative", ["scaling", *M, "--gpus", "8", "--tokens", "-1", "-o", "new"], 1,
     "--tokens must be positive"),
    ("scaling batch-per-gpu nan", ["scaling", *M, "--gpus", "8", "--batch-per-gpu", "nan", "-o", "new"], 1,
     "--batch-per-gpu must be a finite"),
    ("scaling other gpu profile", ["scaling", *M, "--gpus", "8", "--profile", "h100-sxm", "-o", "new"], 1,
     "measured on h100-sxm"),
]


def snapshot(root: Path) -> dict:
    """Every path under root with its kind and content hash (a changed, added or removed file shows)."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        out[rel] = "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def run_main(argv, capsys) -> tuple[int, str, str]:
    rc = main(list(argv))
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


@pytest.mark.parametrize("label,argv,code,needle", CASES, ids=[c[0] for c in CASES])
def test_bad_input(label, argv, code, needle, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    setup_files(tmp_path)
    before = snapshot(tmp_path)
    rc, out, err = run_main(argv, capsys)
    assert rc == code, (rc, out, err)
    assert "Traceback" not in err and "Traceback" not in out
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("plan: ") and needle in lines[0], lines[0]
    assert snapshot(tmp_path) == before, "the refused command wrote or changed a file"


def test_at_least_eighty_cases_over_all_seven_subcommands():
    kinds = {c[1][0] if c[1][0] in ("profile", "launch", "validate", "calibrate", "scaling", "export") else "plan"
             for c in CASES}
    assert len(CASES) >= 80 and kinds == {"plan", "profile", "launch", "validate", "calibrate", "scaling", "export"}


# -- through a real process: the entry point, --version, --help ---------------------------------------------

def test_version_and_help_list_exit_codes():
    rc, out, err = run_cli("--version")
    assert rc == 0 and out.startswith("parallel-plan ") and "(commit " in out, (out, err)
    rc, out, err = run_cli("--help")
    assert rc == 0
    text = " ".join(out.split())
    assert "exit codes: 0 done; 1 bad input" in text and "2 no layout fits in memory" in text and "130 interrupted" in text


@pytest.mark.parametrize("args,needle", [
    (("--model", "gpt-1.3b", "--gpus", "8", "--inter-node-gbps", "nan"), "--inter-node-gbps must be a finite"),
    (("export", "nope.json", "--to", "slurm"), "does not exist"),
    (("validate", "nope.json", "--timeout", "-5"), "--timeout must be at least 0"),
])
def test_subprocess_cases_are_one_sentence(tmp_path, args, needle):
    rc, out, err = run_cli(*args, cwd=tmp_path)
    assert rc == 1 and "Traceback" not in err
    assert err.splitlines() == [err.strip()] and err.startswith("plan: ") and needle in err
    assert list(tmp_path.iterdir()) == []


def test_validate_append_ends_the_last_line_first(tmp_path):
    """A results CSV edited by hand and saved without its final line end gets one before the new row."""
    from runtime.validate import append_row

    path = tmp_path / "r.csv"
    header = ",".join(RESULT_COLUMNS)
    row = dict.fromkeys(RESULT_COLUMNS, "1")
    path.write_text(header + "\r\n" + ",".join(["0"] * len(RESULT_COLUMNS)))   # no final line end
    assert append_row(path, row, tiny_plan()) == 2
    lines = path.read_text().splitlines()
    assert lines == [header, ",".join(["0"] * len(RESULT_COLUMNS)), ",".join(["1"] * len(RESULT_COLUMNS))]


def test_scaling_force_still_refuses_a_file_where_a_report_goes(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "memory.png").mkdir()
    rc, out, err = run_main(["scaling", "--model", "gpt-1.3b", "--gpus", "8", "-o", "r", "--force"], capsys)
    assert rc == 1 and err.strip() == "plan: 'r/memory.png' is a folder; -o needs that name for a file"


