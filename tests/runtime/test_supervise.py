"""Supervised workers (runtime/supervise.py): none outlives `plan launch` or torchrun, and a hung rank ends the
job within --timeout in one sentence naming the rank, the step and the checkpoint; resuming from it continues
the same loss curve."""
import csv
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runtime.launch import main
from tests.runtime.test_launch import ROOT, _wait_for_rows, write_plan

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, state) of every process (zombies included, state 'Z')."""
    out = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            out[int(d.name)] = (int(fields[1]), fields[0])
    return out


def _descendants(pid: int) -> list[int]:
    procs = _processes()
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        kids = [p for p, (pp, _) in procs.items() if pp == parent]
        found += kids
        frontier += kids
    return found


def _alive(pids) -> list[int]:
    procs = _processes()
    return [p for p in pids if p in procs and procs[p][1] != "Z"]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _rank_of(pid: int) -> int | None:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    ranks = [e[5:] for e in env if e.startswith(b"RANK=")]
    return int(ranks[0]) if ranks else None


def _gone_within(pids, seconds=10.0) -> list[int]:
    end = time.monotonic() + seconds
    while _alive(pids) and time.monotonic() < end:
        time.sleep(0.2)
    return _alive(pids)


def _launch(tmp_path, name, dp, *extra):
    plan = str(write_plan(tmp_path / f"{name}.json", tp=1, dp=dp, micro_batch=2, sharding="none"))
    results = tmp_path / f"{name}.csv"
    argv = [plan, "--device", "cpu", "--steps", "100000", "--ckpt-dir", str(tmp_path / f"{name}-ck"),
            "--results", str(results), *extra]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", "import sys; from runtime.launch import main; "
                             "sys.exit(main(sys.argv[1:]))", *argv], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return proc, results, argv


def test_no_worker_outlives_the_launcher_or_torchrun(tmp_path):
    """kill -9 of `plan launch`: torchrun and the worker are gone within 10 s (parent-death signals). kill -9 of
    torchrun alone: the worker goes with it, and the launch says so in one sentence, exiting 1."""
    proc, results, _ = _launch(tmp_path, "a", 1)
    try:
        _wait_for_rows(results, 2, proc)
        family = _descendants(proc.pid)
        assert any("runtime.train" in _cmdline(p) for p in family), family
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        assert _gone_within(family) == []
    finally:
        proc.kill()
    proc, results, _ = _launch(tmp_path, "b", 1)
    try:
        _wait_for_rows(results, 2, proc)
        family = _descendants(proc.pid)
        torchrun = [p for p in family if "torch.distributed.run" in _cmdline(p)]
        assert len(torchrun) == 1, family
        os.kill(torchrun[0], signal.SIGKILL)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert _gone_within(family) == []
    assert proc.returncode == 1, err
    assert err.strip() == ("plan: torchrun was killed by SIGKILL and its workers ended with it; "
                                            "no checkpoint was saved"), err


def test_a_stopped_rank_ends_the_job_and_the_run_resumes_on_the_same_curve(tmp_path):
    """SIGSTOP of rank 1 of two: no heartbeat for half of --timeout 20, so the launch ends the job (every worker
    killed, the stopped one included) with one sentence naming rank 1, its step and the newest checkpoint. A
    resume from a checkpoint before the last logged step reproduces that step's loss."""
    proc, results, argv = _launch(tmp_path, "c", 2, "--timeout", "20", "--save-every", "2")
    try:
        _wait_for_rows(results, 3, proc)
        family = _descendants(proc.pid)
        rank1 = [p for p in family if "runtime.train" in _cmdline(p) and _rank_of(p) == 1]
        assert len(rank1) == 1, family
        os.kill(rank1[0], signal.SIGSTOP)
        _, err = proc.communicate(timeout=20 + 30)  # the monitor's bound, and torchrun's start-up to spare
    finally:
        proc.kill()
    assert _gone_within(family) == []
    assert proc.returncode == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err  # the sentence alone: no torchrun report, no other rank's traceback
    m = re.fullmatch(r"plan: rank 1 stopped responding during step (\d+) \(after step (\d+)\): no heartbeat for "
                     r"(\d+) s \(half of --timeout 20\); the job was ended; resume from '(.+)' with --resume",
                     lines[-1])
    assert m, err
    with open(results, newline="") as f:
        logged = {int(r["step"]): float(r["loss"]) for r in csv.DictReader(f)}
    assert int(m.group(2)) in (max(logged), max(logged) + 1) and int(m.group(1)) == int(m.group(2)) + 1
    ck = tmp_path / "c-ck"
    assert m.group(4) == str(ck / f"step-{max(int(p.name[5:]) for p in ck.glob('step-????????')):08d}")
    # resume from the newest checkpoint before the last logged step, so that the next step was logged above
    start = max(s for s in range(2, max(logged), 2))
    for p in ck.glob("step-????????"):
        if int(p.name[5:]) > start:
            p.rename(p.with_name(p.name + ".later"))
    (ck / "latest").write_text(f"{start}\n")
    resumed = [a if a != "100000" else "1" for a in argv] + ["--resume", "--timeout", "60"]
    assert main(resumed) == 0
    with open(results, newline="") as f:
        again = {int(r["step"]): float(r["loss"]) for r in csv.DictReader(f)}
    assert again[start + 1] == pytest.approx(logged[start + 1], abs=2e-6)


def test_bad_timeout_is_refused(tmp_path, capsys):
    plan = str(write_plan(tmp_path / "p.json", tp=1, micro_batch=2, sharding="none"))
    for bad in ("0", "-5", "nan", "inf"):
        assert main([plan, "--device", "cpu", "--nproc-per-node", "1", "--timeout", bad]) == 1
        err = capsys.readouterr().err.strip()
        assert err.startswith("plan: --timeout must be a number of seconds above 0") and "\n" not in err


def test_a_killed_rank_ends_in_one_sentence(tmp_path):
    """kill -9 of rank 1 of two: torchrun stops rank 0; the launch prints one sentence naming rank 1, the signal
    and its step, in place of torchrun's report and rank 0's traceback about the lost peer."""
    proc, results, _ = _launch(tmp_path, "d", 2, "--save-every", "2")
    try:
        _wait_for_rows(results, 3, proc)
        family = _descendants(proc.pid)
        rank1 = [p for p in family if "runtime.train" in _cmdline(p) and _rank_of(p) == 1]
        assert len(rank1) == 1, family
        os.kill(rank1[0], signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert _gone_within(family) == []
    assert proc.returncode == 1, err
    assert re.fullmatch(r"plan: rank 1 was killed by SIGKILL during step \d+ \(after step \d+\); the job was "
                        rf"ended; resume from '{tmp_path}/d-ck/step-\d{{8}}' with --resume", err.strip()), err
