"""`plan scaling` on a small case: CSV, plots and report written; the first point's efficiency is 1; an
existing CSV is not overwritten without --force; a point where nothing fits is a row, not a crash."""
import math

import pandas as pd

from planner.cli import main as cli_main

SMALL = ["scaling", "--model", "gpt-1.3b", "--gpus", "1,2,4", "--global-batch", "16", "--tokens", "1B"]


def test_strong_scaling_writes_csv_plots_report(tmp_path, capsys):
    out = tmp_path / "sc"
    assert cli_main(SMALL + ["-o", str(out)]) == 0
    for f in ("scaling.csv", "throughput.png", "efficiency.png", "breakdown.png", "memory.png", "report.md"):
        assert (out / f).stat().st_size > 0, f
    df = pd.read_csv(out / "scaling.csv")
    assert list(df["gpus"]) == [1, 2, 4] and (df["status"] == "ok").all()
    assert df["efficiency"].iloc[0] == 1.0
    assert (df["global_batch"] == 16).all()
    assert (df["tp"] * df["pp"] * df["dp"] * df["cp"] == df["gpus"]).all()
    assert (df["mem_max_gib"] <= df["mem_limit_gib"]).all()
    assert math.isclose(df["gpu_hours"].iloc[0], 1e9 / df["tokens_per_s"].iloc[0] / 3600, rel_tol=1e-9)
    assert {"t_compute_s", "t_bubble_s", "t_dp_comm_s"} <= set(df.columns)
    report = (out / "report.md").read_text()
    assert "![throughput](throughput.png)" in report and "Provenance" in report and "modelled" in report
    # refuses to overwrite, one sentence
    capsys.readouterr()
    assert cli_main(SMALL + ["-o", str(out)]) == 1
    err = capsys.readouterr().err.strip()
    assert "already exists" in err and "--force" in err and "\n" not in err
    assert cli_main(SMALL + ["-o", str(out), "--force"]) == 0


def test_weak_scaling_whatif_and_no_fit_row(tmp_path):
    out = tmp_path / "weak"
    v = tmp_path / "validate.csv"
    pd.DataFrame([dict(model="gpt-13b", gpus=8, tp=1, pp=1, vpp=1, dp=8, cp=1, ep=1, micro_batch=1, global_batch=64,
                       seq_len=2048, recompute="none", predicted_step_s=2.6, measured_step_s=3.0,
                       predicted_mem_gib=110.0, measured_mem_gib=105.0, gpu="h200-sxm", profile="x", commit="abc",
                       date="2026-01-01"),
                  dict(model="other", gpus=8, tp=1, pp=1, vpp=1, dp=8, cp=1, ep=1, micro_batch=1, global_batch=64,
                       seq_len=2048, recompute="none", predicted_step_s=1, measured_step_s=1, predicted_mem_gib=1,
                       measured_mem_gib=1, gpu="h200-sxm", profile="x", commit="abc", date="2026-01-01")]).to_csv(v, index=False)
    assert cli_main(["scaling", "--model", "gpt-13b", "--gpus", "1,8", "--weak", "--batch-per-gpu", "8",
                     "--compare-gpu", "h100-sxm", "--compare-inter-node-gbps", "25", "--validate-csv", str(v),
                     "-o", str(out)]) == 0
    df = pd.read_csv(out / "scaling.csv")
    assert df["series"].nunique() == 3
    one = df[df["gpus"] == 1]
    assert (one["status"] == "no fit").all() and one["reason"].str.contains("fits in memory").all()
    eight = df[(df["gpus"] == 8)]
    assert (eight["global_batch"] == 64).all() and (eight["status"] == "ok").all()
    assert (eight["efficiency"] == 1.0).all()  # the first point with a plan is the baseline
    base = eight.iloc[0]
    assert base["measured_step_s"] == 3.0 and math.isclose(base["measured_tokens_per_s"], 64 * 2048 / 3.0)
    report = (out / "report.md").read_text()
    assert "Measured points" in report and "| 8 |" in report and "h100-sxm" in report
    assert "Points without a plan" in report


def test_bad_inputs_are_one_sentence(tmp_path, capsys):
    cases = [
        (["scaling", "--model", "nope", "--gpus", "8", "-o", str(tmp_path / "a")], "unknown model"),
        (["scaling", "--model", "gpt-1.3b", "--gpus", "8,x", "-o", str(tmp_path / "a")], "--gpus"),
        (["scaling", "--model", "gpt-1.3b", "--gpus", "8", "--global-batch", "8", "--batch-per-gpu", "1",
          "-o", str(tmp_path / "a")], "not both"),
        (["scaling", "--model", "gpt-1.3b", "--gpus", "8", "--validate-csv", str(tmp_path / "missing.csv"),
          "-o", str(tmp_path / "a")], "does not exist"),
        (["scaling", "--model", "gpt-1.3b", "--gpus", "8", "--tokens", "nanT", "-o", str(tmp_path / "a")],
         "--tokens must be a finite number"),
        (["scaling", "--model", "gpt-1.3b", "--gpus", "8", "--tokens", "1e400", "-o", str(tmp_path / "a")],
         "--tokens must be a finite number"),
    ]
    for argv, expect in cases:
        assert cli_main(argv) == 1
        err = capsys.readouterr().err.strip()
        assert expect in err and "\n" not in err, err


def test_no_point_with_a_plan_still_writes_the_report(tmp_path):
    """Every GPU count without a plan (gpt-175b on 8 GPUs needs at least 32): the rows, plots and report are
    written; the throughput plot has no positive value to put on its log axis and must not fail on it."""
    out = tmp_path / "none"
    assert cli_main(["scaling", "--model", "gpt-175b", "--gpus", "8", "-o", str(out)]) == 0
    df = pd.read_csv(out / "scaling.csv")
    assert (df["status"] == "no fit").all() and df["reason"].str.contains("fits in memory").all()
    for f in ("throughput.png", "efficiency.png", "breakdown.png", "memory.png", "report.md"):
        assert (out / f).stat().st_size > 0, f
    assert "Points without a plan" in (out / "report.md").read_text()


def test_weak_scaling_without_a_whole_batch_at_any_point_writes_the_report(tmp_path):
    """0.3 sequences per GPU gives no whole global batch at 8 or 16 GPUs: every row says why, and the weak-scaling
    header, which names the first and last global batch, must not fail on there being none."""
    out = tmp_path / "weak"
    assert cli_main(["scaling", "--model", "gpt-1.3b", "--gpus", "8,16", "--weak", "--batch-per-gpu", "0.3",
                     "-o", str(out)]) == 0
    df = pd.read_csv(out / "scaling.csv")
    assert (df["status"] == "impossible").all() and df["reason"].str.contains("not a whole number").all()
    assert "Weak scaling" in (out / "report.md").read_text()
