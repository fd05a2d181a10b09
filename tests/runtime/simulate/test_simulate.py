"""`plan validate --simulate` (runtime/simulate/): a rank of a 64-rank plan is built and stepped under the fake
process group and fake tensors, and its traced tensors and collectives stand beside the planner's prediction."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from planner.cluster import ClusterSpec
from planner.model import tiny_model
from planner.plan import Layout, Plan, TrainingShape, even_stages
from runtime.simulate.roles import default_ranks, parse_ranks

ROOT = Path(__file__).resolve().parents[3]


def _plan(tmp_path, **moe) -> Path:
    """A tiny Llama at TP2 PP2 DP16 (64 ranks), ZeRO-1, 2 micro-batches per step; with `moe`, its MoE at EP4."""
    spec = tiny_model("llama", hidden=256, ffn_hidden=512, num_layers=4, num_heads=8, num_kv_heads=4,
                      vocab_size=1024, max_seq_len=256, **moe)
    lay = Layout(tp=2, pp=2, dp=16, ep=4 if moe else 1, micro_batch=1, sharding="optimizer")
    plan = Plan(spec, ClusterSpec(num_gpus=64).to_dict(), TrainingShape(256, 32), lay, even_stages(4, 2))
    path = tmp_path / "plan.json"
    plan.save(path)
    return path


def test_default_ranks_cover_every_pipeline_rank_and_an_expert_rank():
    assert default_ranks(Layout(tp=2, pp=4, dp=8)) == [0, 16, 32, 48]
    assert default_ranks(Layout(tp=2, pp=2, dp=8, ep=4)) == [0, 6, 16]
    assert parse_ranks("3,1", Layout(tp=2, dp=2)) == [1, 3]


def _simulate(plan: Path, ranks: str) -> list[dict]:
    out = subprocess.run([sys.executable, "-m", "runtime.simulate", str(plan), "--ranks", ranks, "--json"],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["ranks"]


@pytest.mark.parametrize("moe", [{}, {"num_experts": 8, "top_k": 2}], ids=["dense", "moe-ep4"])
def test_a_64_rank_plan_simulates_within_the_planner_memory(tmp_path, moe):
    ranks = _simulate(_plan(tmp_path, **moe), "0,63" if not moe else "0")
    assert [r["stage"] for r in ranks] == ([0, 1] if not moe else [0])
    keys = [("reduce_scatter", "dp_cp"), ("all_gather", "dp_cp"), ("send", "pp"), ("recv", "pp"),
            ("reduce_scatter", "tp")] + ([("all_to_all", "ep"), ("reduce_scatter", "expert_dp")] if moe else [])
    for r in ranks:
        # states as counted (the flat buffers pad each bucket to a multiple of 64 x dp_cp elements); tensors within
        # the bars (8%, and at most 5% over)
        for part in ("weights", "gradients", "optimizer"):
            assert r["traced_parts_gib"][part] == pytest.approx(r["predicted_parts_gib"][part], rel=0.01), part
        err = r["traced_tensor_gib"] / r["predicted_tensor_gib"] - 1
        assert -0.08 <= err <= 0.05, err
        by = {(c["kind"], c["group"]): c for c in r["collectives"]}
        for key in keys:
            assert by[key]["traced_bytes"] == pytest.approx(by[key]["predicted_bytes"], rel=0.02), key


def test_tied_cp_zero2_pipeline_collectives_equal_the_cost_model(tmp_path):
    """A tied GPT at TP2 PP2 CP2 DP2 under ZeRO-2: the tied embedding's gradient all-reduce between the first and
    last stage, the head's backward re-gather (TP all-gathers of the last stage), ring attention's fp32 dK/dV
    (CP send/recv) all as the cost model prices them, and the full-size gradient buckets ZeRO-2 holds in a
    pipeline within the planner's tensors."""
    spec = tiny_model("gpt", hidden=256, ffn_hidden=512, num_layers=4, num_heads=8, num_kv_heads=8,
                      vocab_size=1024, max_seq_len=256, tie_embeddings=True)
    lay = Layout(tp=2, pp=2, cp=2, dp=2, micro_batch=1, sharding="optimizer+grads")
    path = tmp_path / "plan.json"
    Plan(spec, ClusterSpec(num_gpus=16).to_dict(), TrainingShape(256, 8), lay, even_stages(4, 2)).save(path)
    for r in _simulate(path, "0,15"):
        by = {(c["kind"], c["group"]): c for c in r["collectives"]}
        for key in (("all_reduce", "embedding"), ("all_gather", "tp"), ("reduce_scatter", "tp"), ("send", "cp"),
                    ("recv", "cp"), ("send", "pp")):
            assert by[key]["traced_bytes"] == pytest.approx(by[key]["predicted_bytes"], rel=1e-3), key
        err = r["traced_tensor_gib"] / r["predicted_tensor_gib"] - 1
        assert -0.08 <= err <= 0.05, err


def _tiny_plan(tmp_path) -> Path:
    spec = tiny_model("llama")
    path = tmp_path / "tiny.json"
    Plan(spec, ClusterSpec(num_gpus=2, gpus_per_node=2).to_dict(), TrainingShape(32, 4),
         Layout(pp=2, micro_batch=1, sharding="none"), even_stages(4, 2)).save(path)
    return path


@pytest.mark.parametrize("extra,needle", [
    (["-o", "{tmp}/afile"], "exists and is not a folder"),
    (["-o", "{tmp}/done"], "simulation.json' already exists; pass --force"),
    (["-o", "{tmp}/missing/dir"], "does not exist"),
    (["--steps", "0"], "--steps must be at least 1"),
    (["--jobs", "two"], "--jobs must be a whole number"),
    (["--bogus"], "unrecognized arguments: --bogus"),
])
def test_bad_arguments_are_one_sentence_before_any_rank(tmp_path, capsys, extra, needle):
    """Bad arguments of `plan validate --simulate` exit 1 with one sentence before any rank process starts: an
    output that is a file, or a simulation.json that exists (no --force), is refused up front, not after minutes
    of simulation (or with a FileExistsError traceback)."""
    from planner.cli import main as cli_main
    plan = _tiny_plan(tmp_path)
    (tmp_path / "afile").write_text("mine\n")
    (tmp_path / "done").mkdir()
    (tmp_path / "done" / "simulation.json").write_text("mine\n")
    argv = ["validate", str(plan), "--simulate", *[a.format(tmp=tmp_path) for a in extra]]
    assert cli_main(argv) == 1
    cap = capsys.readouterr()
    err = cap.err.strip()
    assert needle in err and "\n" not in err and "Traceback" not in err, err
    assert (tmp_path / "afile").read_text() == "mine\n" and (tmp_path / "done" / "simulation.json").read_text() == "mine\n"


def test_output_folder_is_written_and_kept_without_force(tmp_path, capsys):
    from planner.cli import main as cli_main
    plan, out = _tiny_plan(tmp_path), tmp_path / "sim"
    assert cli_main(["validate", str(plan), "--simulate", "--ranks", "0", "-o", str(out)]) == 0
    assert json.loads((out / "simulation.json").read_text())["ranks"][0]["rank"] == 0
    assert cli_main(["validate", str(plan), "--simulate", "--ranks", "1", "-o", str(out)]) == 1
    assert json.loads((out / "simulation.json").read_text())["ranks"][0]["rank"] == 0
    assert cli_main(["validate", str(plan), "--simulate", "--ranks", "1", "-o", str(out), "--force"]) == 0
    assert json.loads((out / "simulation.json").read_text())["ranks"][0]["rank"] == 1


def test_a_plan_for_the_cpu_kind_simulates(tmp_path):
    """A plan made for --gpu cpu (the CPU loop: plan profile --device cpu, plan --gpu cpu --profile ...) has no shipped
    profile; the simulation's predictions (memory, collective bytes) read no timing, so it is simulated all the same
    (it stopped with 'no profile ships for GPU cpu')."""
    spec = tiny_model("llama")
    path = tmp_path / "cpu.json"
    Plan(spec, ClusterSpec(gpu="cpu", num_gpus=2, gpus_per_node=2).to_dict(), TrainingShape(32, 4),
         Layout(tp=2, micro_batch=1, sharding="none", cuda_graph=False), even_stages(4, 1)).save(path)
    (rank,) = _simulate(path, "0")
    assert rank["traced_parts_gib"]["weights"] == pytest.approx(rank["predicted_parts_gib"]["weights"], rel=0.01)
