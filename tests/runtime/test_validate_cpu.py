"""plan validate on CPU: a real (tiny) run appends a well-formed results row and its plan; refusals are one
sentence; the sweep's plans are legal and distinct."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from planner.calibrate import RESULT_COLUMNS, read_results, read_sidecar, sidecar_path
from planner.cluster import ClusterSpec
from planner.model import tiny_model
from planner.plan import Plan, TrainingShape
from planner.profile import load_profile
from planner.search import Pins, search

REPO = Path(__file__).resolve().parents[2]


def _cli(*args, timeout=300):
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-m", "planner.cli", *map(str, args)], capture_output=True, text=True,
                       cwd=REPO, env=env, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


@pytest.fixture(scope="module")
def tiny_plan(tmp_path_factory) -> Path:
    cluster = ClusterSpec(gpu="h200-sxm", num_gpus=1, gpus_per_node=1)
    res = search(tiny_model("llama"), TrainingShape(32, 4), cluster, load_profile("h200-sxm", "h200-sxm"),
                 Pins(micro_batch=2, recompute="selective"), top_k=1)
    path = tmp_path_factory.mktemp("val") / "plan.json"
    res.plans[0].save(path)
    return path


def test_validate_cpu_appends_row(tiny_plan, tmp_path):
    out = tmp_path / "sub" / "results.csv"
    out.parent.mkdir()  # an --append file's folder must exist (none is made silently)
    rc, so, se = _cli("validate", tiny_plan, "--steps", "4", "--warmup", "1", "--device", "cpu", "--append", out)
    assert rc == 0, se
    assert "step time (s)" in so and "appended row 1" in so
    # the workers were asked for the traced step and answered with the CPU marker; nothing traced, nothing kept
    assert "components of one extra step, traced after the measured ones (torch.profiler, GPU kernels): " \
           "not traced on CPU (no GPU kernels to time)" in so
    assert "(not timed apart by the runtime)" in so
    rows = read_results(out)  # checks the exact header
    assert len(rows) == 1
    r = rows[0]
    assert list(r)[:-1] == RESULT_COLUMNS
    plan = Plan.load(tiny_plan)
    assert r["model"] == "tiny-llama" and int(r["gpus"]) == 1 and int(r["micro_batch"]) == 2
    assert r["recompute"] == "4s4" and int(r["seq_len"]) == 32 and int(r["global_batch"]) == 4
    assert float(r["measured_step_s"]) > 0 and float(r["predicted_step_s"]) > 0
    assert abs(float(r["predicted_mem_gib"]) - max(plan.prediction.memory_gib_per_rank)) < 1e-3 * max(
        plan.prediction.memory_gib_per_rank)
    assert r["measured_mem_gib"] == ""  # no CUDA allocator on CPU
    assert r["gpu"] == "cpu" and r["profile"] == "shipped:h200-sxm-calibrated" and r["commit"] and r["date"]
    side = read_sidecar(sidecar_path(out))
    assert Plan.from_dict(side[1]).layout == plan.layout
    assert "components" not in json.loads(sidecar_path(out).read_text())


def test_traced_step_is_asked_for_unless_no_trace(tiny_plan, monkeypatch, capsys):
    """The workers get --components-out (a file for one plan) by default, on CPU too (they answer with the CPU
    marker); --no-trace leaves it out."""
    from runtime import validate as V

    cmds = []
    monkeypatch.setattr(V, "_run", lambda cmd, env, timeout, ranks=range(0): cmds.append(cmd) or 0)
    for extra in ([], ["--no-trace"]):
        assert V.main([str(tiny_plan), "--steps", "2", "--warmup", "1", "--device", "cpu", *extra]) == 1
        assert "wrote no per-step results" in capsys.readouterr().err
    asked, skipped = cmds
    assert asked[asked.index("--components-out") + 1].endswith("0000.components.json")
    assert "--components-out" not in skipped


def test_the_last_plan_left_after_failures_gets_a_results_file(tiny_plan, monkeypatch, capsys):
    """Plans of one world size share a torchrun with a results folder; after a plan fails the run restarts at the
    next one, and when only one is left its worker is given a results file, as runtime/train.py reads one plan's
    --results (a folder there stopped the plan with IsADirectoryError)."""
    from runtime import validate as V

    cmds = []
    monkeypatch.setattr(V, "_run", lambda cmd, env, timeout, ranks=range(0): cmds.append(cmd) or 1)
    assert V.main([str(tiny_plan)] * 3 + ["--steps", "2", "--warmup", "1", "--device", "cpu"]) == 1
    assert "3 of 3 plans failed" in capsys.readouterr().err

    def plans_and_results(cmd):
        i = cmd.index("--plan")
        return cmd[i + 1:cmd.index("--steps", i)], cmd[cmd.index("--results") + 1]

    (first, folder), (second, folder2), (last, file) = map(plans_and_results, cmds)
    assert [len(first), len(second), len(last)] == [3, 2, 1]
    assert folder == folder2 and not folder.endswith(".csv")
    assert Path(file) == Path(folder) / f"{Path(last[0]).stem}.csv"
    assert cmds[2][cmds[2].index("--components-out") + 1] == str(Path(folder) / "0002.components.json")


def test_sidecar_keeps_the_traced_components(tiny_plan, tmp_path):
    from runtime.trace_analysis import RankComponents
    from runtime.validate import TracedStep, append_row

    ranks = [RankComponents(r, 0.5 + r, 0.4, 0.3, 0.2, 0.1) for r in range(2)]
    path = tmp_path / "r.csv"
    row = {k: "x" for k in RESULT_COLUMNS} | {"measured_step_s": "1.5", "measured_mem_gib": "20"}  # in range
    append_row(path, row, Plan.load(tiny_plan), components=TracedStep(4, ranks))
    rec = json.loads(sidecar_path(path).read_text())
    assert rec["components"]["step"] == 4
    assert [RankComponents.from_dict(d) for d in rec["components"]["ranks"]] == ranks
    assert rec["components"]["ranks"][1]["idle_s"] == pytest.approx(1.5 - 0.4)
    assert len(read_results(path)) == 1   # read_results refuses a CSV whose columns are not RESULT_COLUMNS


def test_append_numbers_rows_and_never_rewrites(tiny_plan, tmp_path):
    from runtime.validate import append_row

    plan = Plan.load(tiny_plan)
    path = tmp_path / "r.csv"
    row = {k: "x" for k in RESULT_COLUMNS}
    assert append_row(path, row, plan) == 1
    first = path.read_text()
    assert append_row(path, row, plan) == 2
    assert path.read_text().startswith(first)
    assert path.read_text().count("model,gpus") == 1
    assert sorted(read_sidecar(sidecar_path(path))) == [1, 2]


def test_validate_refusals_are_one_sentence(tiny_plan, tmp_path):
    foreign = tmp_path / "foreign.csv"
    foreign.write_text("step,loss\n1,2\n")
    rc, so, se = _cli("validate", tiny_plan, "--device", "cpu", "--append", foreign)
    assert rc == 1 and "other columns" in se and "Traceback" not in se
    assert foreign.read_text() == "step,loss\n1,2\n"
    rc, so, se = _cli("validate", tiny_plan, "--steps", "2", "--warmup", "2", "--device", "cpu")
    assert rc == 1 and "must exceed --warmup" in se and "Traceback" not in se


@pytest.mark.parametrize("gpus", [1, 2, 4, 8])
def test_sweep_plans_are_legal_distinct_and_sized(gpus):
    sys.path.insert(0, str(REPO / "benchmarks"))
    import validation_sweep as vs

    plans = vs.build_plans(gpus)
    assert len(plans) >= {1: 12, 2: 20, 4: 10, 8: 10}[gpus]   # 4 and 8 together: issue 8's 20
    assert len({stem for stem, _ in plans}) == len(plans)
    models = {p.model.name for _, p in plans}
    assert {"gpt-1.3b", "llama-1b-gqa", "moe-small", "bert-large"} <= models
    for _, p in plans:
        assert p.layout.world_size == gpus
        Plan.from_dict(json.loads(json.dumps(p.to_dict())))  # legality re-checked on load
        assert vs.estimate_s(p, 6) < 25
    if gpus == 2:
        lays = [p.layout for _, p in plans]
        assert any(l.tp == 2 for l in lays) and any(l.pp == 2 and l.vpp == 1 for l in lays)
        assert any(l.vpp == 2 for l in lays) and any(l.cp == 2 for l in lays) and any(l.ep == 2 for l in lays)
        assert {l.sharding for l in lays if l.dp == 2} >= {"none", "optimizer"}
    if gpus == 8:   # issue 8's dimensions: TP8, PP4 with virtual stages, DP8 ZeRO-1, CP4, EP8, mixes
        lays = [p.layout for _, p in plans]
        assert any(l.tp == 8 for l in lays) and any(l.pp == 4 and l.vpp > 1 for l in lays)
        assert any(l.dp == 8 and l.sharding == "optimizer" for l in lays) and any(l.cp == 4 for l in lays)
        assert any(l.ep == 8 for l in lays) and any(l.tp > 1 and l.pp > 1 and l.dp > 1 for l in lays)


def test_quality_set_on_eight_gpus_is_the_planners_top_plans():
    sys.path.insert(0, str(REPO / "benchmarks"))
    import validation_sweep as vs

    plans = vs.quality_plans(gpus=8)
    for name in ("gpt-13b", "llama3-8b"):
        mine = [p for _, p in plans if p.model.name == name]
        assert len(mine) >= 10 and all(p.layout.world_size == 8 for p in mine)
        steps = [p.prediction.step_s for p in mine]
        assert steps == sorted(steps)   # rank 1, the planner's first choice, first


def test_validate_several_plans_of_two_world_sizes_in_one_call(tiny_plan, tmp_path):
    """One torchrun per world size runs its plans back to back; every plan gets its own row, in order."""
    cluster = ClusterSpec(gpu="h200-sxm", num_gpus=2, gpus_per_node=2)
    profile = load_profile("h200-sxm", "h200-sxm")
    paths = []
    for i, pins in enumerate([Pins(tp=2, micro_batch=1, recompute="none"),
                              Pins(dp=2, sharding="optimizer", micro_batch=1, recompute="full")]):
        plan = search(tiny_model("gpt"), TrainingShape(32, 4), cluster, profile, pins, top_k=1).plans[0]
        paths.append(tmp_path / f"p{i}.json")
        plan.save(paths[-1])
    out = tmp_path / "results.csv"
    rc, so, se = _cli("validate", paths[0], tiny_plan, paths[1], "--steps", "3", "--warmup", "1", "--device",
                      "cpu", "--append", out, timeout=600)
    assert rc == 0, se
    rows = read_results(out)
    assert [(r["model"], int(r["gpus"]), int(r["tp"]), int(r["dp"])) for r in rows] == [
        ("tiny-gpt", 2, 2, 1), ("tiny-llama", 1, 1, 1), ("tiny-gpt", 2, 1, 2)]
    assert so.count("step time (s)") == 3
    assert so.count("=== plan") == 2  # the two 2-process plans ran in one worker
    assert so.count("not traced on CPU") == 3  # every plan's marker, from its own file in the workers' folder


def test_validate_stopped_midway_still_appends_what_finished(tiny_plan, tmp_path, monkeypatch, capsys):
    """A wall-clock limit's SIGTERM during a sweep (a 56-plan sweep was once lost to it): the plans that
    finished are still reported and appended, the rest are named, and the exit code says it was stopped."""
    from runtime import validate as V

    two = tmp_path / "two.json"
    d = json.loads(tiny_plan.read_text())
    d["layout"]["dp"], d["cluster"]["num_gpus"], d["training"]["global_batch"] = 2, 2, 8
    two.write_text(json.dumps(d))
    real = V._run_plans
    calls = []

    def run_then_stop(args, files, out):
        calls.append(len(files))
        if len(calls) == 2:   # the second world size: as if SIGTERM arrived while it ran
            raise SystemExit(143)
        return real(args, files, out)

    monkeypatch.setattr(V, "_run_plans", run_then_stop)
    out = tmp_path / "r.csv"
    rc = V.main([str(tiny_plan), str(two), "--steps", "3", "--warmup", "1", "--device", "cpu", "--append", str(out)])
    assert rc == 143
    assert len(read_results(out)) == 1
    assert "stopped (SIGTERM) before this plan finished" in capsys.readouterr().err


def test_report_flags_host_paced_plans(tiny_plan):
    """The printed comparison says when the prediction is set by the host, whose speed varies by machine."""
    from types import SimpleNamespace

    from runtime.validate import report
    plan = Plan.from_dict(json.loads(Path(tiny_plan).read_text()))
    meas = {"steps": 4, "step_s_min": 0.9, "step_s_max": 1.1, "step_s": 1.0, "mem_gib": 1.0, "mem_by_rank": "",
            "optimizer_s": None, "bubble_frac": None}
    paced = SimpleNamespace(step_s=1.0, memory_gib_per_rank=[1.0], breakdown_s={"compute": 0.3, "host": 0.7})
    gpu = SimpleNamespace(step_s=1.0, memory_gib_per_rank=[1.0], breakdown_s={"compute": 0.95, "host": 0.05})
    assert "host-paced plan (70%" in report(plan, paced, meas)
    assert "host-paced" not in report(plan, gpu, meas)


@pytest.mark.parametrize("where,says", [("{tmp}", "is a folder"), ("/proc/results.csv", "cannot be written"),
                                        ("{tmp}/file.txt/results.csv", "is not a folder")])
def test_bad_append_path_is_one_sentence_before_the_run(tiny_plan, tmp_path, monkeypatch, capsys, where, says):
    from runtime import validate as V

    (tmp_path / "file.txt").write_text("a file")
    monkeypatch.setattr(V, "_run_plans", lambda *a: pytest.fail("ran before checking --append"))
    assert V.main([str(tiny_plan), "--device", "cpu", "--append", where.format(tmp=tmp_path)]) == 1
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    rc, so, se = _cli("validate", tiny_plan, "--device", "cpu", "--append", tmp_path)   # through `plan`
    assert rc == 1 and "is a folder" in se and "Traceback" not in se


def test_profile_column_names_the_file_used():
    """Without --profile the calibrated default is read where it ships, and the row says so."""
    from planner.profile import default_profile_path
    from runtime.validate import profile_label

    assert default_profile_path("h200-sxm").stem == "h200-sxm-calibrated"
    assert profile_label(None, "h200-sxm") == "shipped:h200-sxm-calibrated"
    assert profile_label("h200-sxm", "h200-sxm") == "shipped:h200-sxm"            # a shipped profile by name
    assert profile_label("/some/where/mine.json", "h200-sxm") == "/some/where/mine.json"


def test_validate_with_a_bad_profile_is_one_sentence(tiny_plan, tmp_path):
    d = json.loads((REPO / "profiles" / "h200-sxm.json").read_text())
    d["gemm"]["points"][0][3] = float("nan")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(d))
    rc, so, se = _cli("validate", tiny_plan, "--device", "cpu", "--profile", bad)
    assert rc == 1 and "bad.json' is corrupted: gemm.points[0] seconds is nan" in se and "Traceback" not in se
