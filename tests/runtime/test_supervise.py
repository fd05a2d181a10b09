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


# -- from the first instant: job ids, torchrun watched, early kills -----------------------------------------------

def _job_of(launcher_pid: int) -> list[int]:
    """Live processes started for the launch `launcher_pid` (they carry its pid in LAUNCHER_PID_ENV)."""
    from runtime.supervise import LAUNCHER_PID_ENV
    needle = f"{LAUNCHER_PID_ENV}={launcher_pid}".encode()
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if needle in (d / "environ").read_bytes().split(b"\0"):
                    found.append(int(d.name))
            except OSError:
                continue
    return _alive(found)


def _job_gone_within(launcher_pid: int, seconds: float = 10.0) -> list[int]:
    end = time.monotonic() + seconds
    while _job_of(launcher_pid) and time.monotonic() < end:
        time.sleep(0.1)
    return _job_of(launcher_pid)


def _wait_until(condition, proc, seconds: float = 60.0):
    end = time.monotonic() + seconds
    while time.monotonic() < end and proc.poll() is None:
        found = condition()
        if found:
            return found
        time.sleep(0.02)
    raise AssertionError(f"not seen within {seconds} s (launch exit code {proc.poll()})")


def _torchrun_of(proc):
    return [p for p in _descendants(proc.pid) if "torch.distributed.run" in _cmdline(p)]


def _workers_of(proc):
    return [p for p in _descendants(proc.pid) if "runtime.train" in _cmdline(p)]


@pytest.mark.parametrize("instant", ["torchrun started", "worker started"])
def test_kill_9_of_the_launch_at_an_early_instant_leaves_nothing(tmp_path, instant):
    """kill -9 of `plan launch` as soon as torchrun exists, or as soon as a worker process exists (before it
    imported torch): every process of the job is gone within 10 s."""
    proc, _, _ = _launch(tmp_path, "k", 1)
    try:
        of = _torchrun_of if instant == "torchrun started" else _workers_of
        _wait_until(lambda: of(proc), proc)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        assert _job_gone_within(proc.pid) == []
    finally:
        proc.kill()


def test_a_timeout_shorter_than_start_up_ends_the_whole_job(tmp_path):
    """--timeout 1, shorter than the workers' start-up: the launch ends every process of the job and exits 1 with
    one sentence, rather than leaving the ranks that had not beaten and waiting on their stderr forever."""
    proc, _, _ = _launch(tmp_path, "t", 2, "--timeout", "1")
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 1, err
    assert re.fullmatch(r"plan: (rank \d sent no heartbeat within \d+ s of the launch \(--timeout 1\)|no rank "
                        r"finished a step for \d+ s \(--timeout 1\); rank \d is furthest behind, stuck before its "
                        r"first step); the job was ended; no checkpoint was saved", err.strip()), err
    assert _job_gone_within(proc.pid) == []


def test_a_stopped_torchrun_ends_the_job(tmp_path):
    """SIGSTOP of torchrun while its worker trains: after half of --timeout the launch kills the job (torchrun
    included) and says so in one sentence, rather than waiting forever."""
    proc, _, _ = _launch(tmp_path, "s", 1, "--timeout", "6")
    try:
        _wait_until(lambda: _workers_of(proc), proc)
        torchrun = _torchrun_of(proc)
        assert len(torchrun) == 1
        os.kill(torchrun[0], signal.SIGSTOP)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 1, err
    assert re.fullmatch(r"plan: torchrun was stopped for \d+ s \(half of --timeout 6\); the job was ended; "
                        r"no checkpoint was saved", err.strip()), err
    assert _job_gone_within(proc.pid) == []


def test_end_job_finds_every_process_by_its_job_id():
    """A process and its grandchild carrying the job id both end; one without it is left alone."""
    from runtime import supervise
    env, job = supervise.job_env(dict(os.environ))
    family = subprocess.Popen(["sh", "-c", "sleep 60 & sleep 60"], env=env, start_new_session=True)
    other = subprocess.Popen(["sleep", "60"])
    try:
        end = time.monotonic() + 10
        while len(supervise.job_processes(job)) < 3 and time.monotonic() < end:
            time.sleep(0.05)
        members = supervise.job_processes(job)
        assert len(members) == 3 and other.pid not in members
        supervise.end_job(job)
        assert _gone_within(members) == [] and other.poll() is None
    finally:
        other.kill()
        family.kill()
        family.wait()
        other.wait()


def test_a_stopped_torchrun_is_caught_without_any_worker():
    """The monitor watches torchrun itself: a stopped one is ended after half of the timeout."""
    from runtime import supervise
    env, job = supervise.job_env(dict(os.environ))
    fake = subprocess.Popen(["sleep", "60"], env=env, start_new_session=True)
    try:
        os.kill(fake.pid, signal.SIGSTOP)
        with supervise.Monitor(Path("/nonexistent"), range(0), 1.0, fake, job_id=job) as monitor:
            fake.wait(10)
        assert monitor.verdict.kind == "torchrun stopped" and monitor.killed
        assert re.fullmatch(r"torchrun was stopped for \d+ s \(half of --timeout 1\); the job was ended; nothing "
                            r"was saved", supervise.verdict_sentence(monitor.verdict, 1.0, "", "nothing was saved"))
    finally:
        fake.kill()
        fake.wait()


def test_stderr_is_not_read_past_torchrun_s_exit():
    """A process left holding torchrun's stderr open does not keep the relay waiting once torchrun exited."""
    from runtime.launch import EXITED_GRACE_S, relay_stderr
    read_end, write_end = os.pipe()
    stream = os.fdopen(read_end, errors="replace")
    try:
        start = time.monotonic()
        assert relay_stderr(stream, lambda: True, exited=lambda: True) == []
        assert time.monotonic() - start < EXITED_GRACE_S + 2
    finally:
        os.close(write_end)  # the relay's reader sees the end, and only then is the stream closed under it
        time.sleep(0.2)
        stream.close()


def test_a_worker_whose_launcher_is_not_its_grandparent_exits_at_once(tmp_path):
    """A worker started after its torchrun was orphaned (its parent's parent is not the launcher it was given)
    exits before it imports anything heavy; one whose grandparent is that launcher goes on."""
    from runtime.supervise import LAUNCHER_PID_ENV
    code = "import sys; from runtime.supervise import arm_worker; arm_worker(); print('alive'); sys.exit(0)"
    # the child's parent is this process: its grandparent is this process's parent
    # a launcher pid that is not the grandparent: this process itself (the child's parent); not pid 1, which is
    # the grandparent when this test process was orphaned (run in the background of a shell that exited)
    for launcher, expected in ((os.getpid(), (1, "")), (os.getppid(), (0, "alive\n"))):
        env = {**os.environ, "PYTHONPATH": str(ROOT), LAUNCHER_PID_ENV: str(launcher)}
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
        assert (done.returncode, done.stdout) == expected, (launcher, done.stderr)
