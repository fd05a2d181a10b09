"""No text from a plan, a path or a flag reaches a shell line of an export or of `plan launch --dry-run` except
quoted: a model name with a newline or `$(touch x)` is refused on load, and even a Plan built in memory with one
(no load) gives scripts whose every line bash reads without running it."""
from __future__ import annotations

import json
import shlex
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from planner.export import build_parser, render_megatron, render_slurm, render_torchrun
from planner.plan import Plan
from tests.planner.test_bad_input import tiny_plan

EVIL = ["x\ntouch PWNED_NL", "x$(touch PWNED_SUBST)", "x`touch PWNED_TICK`", "x'; touch PWNED_QUOTE; '"]


def _renders(plan: Plan, plan_path: str, extra: list[str] = ()) -> dict[str, str]:
    args = build_parser().parse_args([plan_path, "--to", "slurm", *extra])
    return {"megatron": render_megatron(plan, plan_path), "torchrun": render_torchrun(plan, plan_path, args),
            "slurm": render_slurm(plan, plan_path, args)}


def _runs_nothing(text: str, folder: Path) -> None:
    """bash reads the script (comments and quoted words only; no command runs): every line that is not a comment
    is a known command of the export, and executing the text with every command stubbed creates no file."""
    for line in text.splitlines():
        assert not line.lstrip().startswith("touch"), line
    stubbed = ("set() { :; }; export() { :; }; scontrol() { :; }; srun() { :; }; exec() { :; }\n"
               "SLURM_JOB_NODELIST=n1; SLURM_JOB_NUM_NODES=1; python() { :; }\n")
    body = "\n".join(ln for ln in text.splitlines() if not ln.startswith("#!")).replace("exit 1", ":")
    subprocess.run(["bash", "-c", stubbed + body.replace(" python ", " : ").replace("\n/", "\n: /")], cwd=folder,
                   capture_output=True, timeout=30)
    assert not [p for p in folder.iterdir() if p.name.startswith("PWNED")], "a shell line ran the injected command"


@pytest.mark.parametrize("name", EVIL)
def test_evil_model_name_is_refused_on_load(tmp_path, name):
    from planner.cli import main

    path = tmp_path / "evil.json"
    plan = tiny_plan()
    d = plan.to_dict()
    d["model"]["name"] = name
    path.write_text(json.dumps(d))
    for to in ("megatron", "torchrun", "slurm"):
        assert main(["export", str(path), "--to", to]) == 1
    assert main(["launch", str(path), "--device", "cpu", "--dry-run"]) == 1
    assert not list(tmp_path.glob("PWNED*"))


@pytest.mark.parametrize("name", EVIL)
def test_evil_name_built_in_memory_reaches_no_shell_line(tmp_path, name):
    """Defence in depth: the renderers never write a model name raw. The name may show in comment lines, with its
    line breaks turned into spaces; the Slurm job name is the name made safe."""
    plan = replace(tiny_plan(), model=replace(tiny_plan().model, name=name))
    evil_path = str(tmp_path / "dir $(touch PWNED_PATH)\nx" / "p.json")
    for kind, text in _renders(plan, evil_path).items():
        for line in text.splitlines():
            if not line.startswith("#"):
                assert name not in line, (kind, line)
        assert "\ntouch" not in text
        _runs_nothing(text, tmp_path)
    slurm = _renders(plan, "p.json")["slurm"]
    job = [ln for ln in slurm.splitlines() if ln.startswith("#SBATCH --job-name=")][0]
    assert job.split("=", 1)[1].replace("-", "").replace(".", "").replace("_", "").isalnum()


def test_flags_reach_the_slurm_script_quoted(tmp_path):
    """--data, --results and the plan path are shell words of LAUNCH_ARGS, read back exactly."""
    data = "w$(touch PWNED_DATA);x"
    results = str(tmp_path / "r `touch PWNED_RES`.csv")
    args = build_parser().parse_args(["p.json", "--to", "slurm", "--data", data, "--results", results])
    text = render_slurm(tiny_plan(), "p.json", args)
    line = [ln for ln in text.splitlines() if ln.startswith("LAUNCH_ARGS=(")][0]
    words = shlex.split(line[len("LAUNCH_ARGS=("):-1])
    assert data in words and results in words
    _runs_nothing(text, tmp_path)


def test_launch_dry_run_prints_a_line_the_shell_reads_back_exactly(tmp_path, capsys):
    """The printed command, given to bash with printf in front of it, yields exactly the argv that would run, and
    nothing runs: the plan's folder and --data carry $(...) and a newline."""
    from runtime.launch import main as launch_main

    folder = tmp_path / "a $(touch PWNED_DIR)\nb"
    folder.mkdir()
    plan_path = folder / "p.json"
    tiny_plan().save(plan_path)
    assert launch_main([str(plan_path), "--device", "cpu", "--dry-run", "--steps", "2"]) == 0
    out = capsys.readouterr().out
    argv = shlex.split(out)
    assert str(plan_path) in argv and argv[argv.index("--plan") + 1] == str(plan_path)
    echoed = subprocess.run(["bash", "-c", "printf '%s\\0' " + out.strip()], cwd=tmp_path, capture_output=True,
                            timeout=30).stdout.decode().split("\0")[:-1]
    assert echoed == argv
    assert not list(tmp_path.glob("PWNED*"))
