"""Supervision of torchrun and its workers: nobody outlives the launcher, and a dead or hung rank ends the job.

Parent-death signal: `plan launch` and `plan validate` start torchrun with PR_SET_PDEATHSIG = SIGKILL (Linux,
through ctypes, set in the child before exec; `plan launch`'s child also exits at once when the launcher died
before the signal was armed: `preexec_bound_to`), and every worker sets the same on itself first thing, before
any heavy import (`arm_worker`, called by runtime/train.py ahead of `import torch`); so `kill -9` of the
launcher takes torchrun with it, and torchrun's death takes its workers (torchrun starts each in a session of
its own, so a process-group kill would miss them). A worker also checks the launcher pid it was given
(LAUNCHER_PID_ENV): when its parent is no longer a torchrun started by that launcher, the launcher or torchrun
died before the signal was armed, and the worker exits. Elsewhere a watchdog thread polls os.getppid() once a
second and ends the process when its parent changed.

The job: `plan launch` gives torchrun a job id in its environment (JOB_ID_ENV, `job_env`), which every worker
and every process they start inherit. Ending the job ends every process whose environment holds it
(`end_job`, a scan of /proc/*/environ), found without relying on heartbeats, so a worker that never beat or a
process it started is ended too; the monitor also sweeps them once torchrun has exited.

Heartbeats: under a launcher, every worker runs a thread that rewrites HEARTBEAT_DIR/rank<r> once a second with
its pid, the last step it finished and when it last made progress (`progress(step)`, called by the training
loop after each step and save). The launcher's `Monitor` reads them: a rank whose file stopped changing for
half of --timeout is not running (stopped, frozen); a live rank that made no progress for --timeout is stuck
(a collective that never completes); a rank whose process is gone without saying it finished died; a rank
that never beat within --timeout of the launch is silent. torchrun is watched too: stopped (SIGSTOP) for half
of --timeout, or still running --timeout after every rank finished, it is hung. In all cases but a death the
monitor ends the job at once; a death is left to torchrun, which stops the others itself. Either way the launcher then prints one sentence naming the rank, the step and the newest
checkpoint (`verdict_sentence`).
"""
from __future__ import annotations

import ctypes
import os
import re
import signal
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

HEARTBEAT_DIR_ENV = "PLAN_HEARTBEAT_DIR"
"""Environment variable naming the folder of the workers' heartbeat files (set by the launcher)."""
JOB_ID_ENV = "PLAN_JOB_ID"
"""Environment variable holding the job id every process of one launch carries (`job_env`, `end_job`)."""
LAUNCHER_PID_ENV = "PLAN_LAUNCHER_PID"
"""Environment variable holding the pid of the launcher that started torchrun (the workers' grandparent)."""
DEFAULT_TIMEOUT_S = 300.0
BEAT_INTERVAL_S = 1.0
_PR_SET_PDEATHSIG = 1


def _set_pdeathsig(sig: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def child_preexec() -> None:
    """For subprocess.Popen(preexec_fn=...): the child (torchrun) is killed when the launcher dies."""
    _set_pdeathsig(signal.SIGKILL)


def preexec_bound_to(launcher_pid: int):
    """For subprocess.Popen(preexec_fn=...) in the launcher `launcher_pid`: the child (torchrun) is killed when
    the launcher dies, and exits at once when the launcher already died between the fork and the arming."""
    def preexec() -> None:
        _set_pdeathsig(signal.SIGKILL)
        if os.getppid() != launcher_pid:
            os._exit(1)
    return preexec


def job_env(env: dict) -> tuple[dict, str]:
    """`env` with a fresh job id and this process's pid as the launcher's; returns it and the job id."""
    job = f"{os.getpid()}-{uuid.uuid4().hex}"
    return {**env, JOB_ID_ENV: job, LAUNCHER_PID_ENV: str(os.getpid())}, job


def _parent_of(pid: int) -> int | None:
    """The parent pid of `pid` from /proc, None when it is gone."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def die_with_parent() -> None:
    """A worker ends when the process that started it (torchrun) ends, whatever killed it; under a launcher that
    gave its pid (LAUNCHER_PID_ENV), also when torchrun or the launcher died before the signal was armed."""
    parent = os.getppid()
    launcher = os.environ.get(LAUNCHER_PID_ENV, "")
    if _set_pdeathsig(signal.SIGKILL):
        if os.getppid() != parent:  # the parent died before the signal was armed
            os._exit(1)
        if launcher.isdigit() and _parent_of(parent) != int(launcher):  # torchrun orphaned before we started
            os._exit(1)
        return

    def watch():
        while os.getppid() == parent:
            time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


class _Heartbeat:
    def __init__(self, folder: Path, rank: int):
        self.path = folder / f"rank{rank}"
        self.step, self.progress_unix, self.state = 0, time.time(), "run"
        self.lock = threading.Lock()
        self._write()
        threading.Thread(target=self._loop, name="heartbeat", daemon=True).start()

    def _write(self) -> None:
        with self.lock:
            text = f"{os.getpid()} {self.step} {self.progress_unix:.3f} {self.state}\n"
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            tmp.write_text(text)
            os.replace(tmp, self.path)
        except OSError:
            pass  # the launcher's folder is gone: it is ending, and so will this process

    def _loop(self) -> None:
        while True:
            time.sleep(BEAT_INTERVAL_S)
            self._write()

    def progress(self, step: int | None = None, state: str = "run") -> None:
        with self.lock:
            if step is not None:
                self.step = step
            self.progress_unix, self.state = time.time(), state
        self._write()


_heartbeat: _Heartbeat | None = None


def arm_worker() -> None:
    """First thing in a worker under a launcher (HEARTBEAT_DIR_ENV or LAUNCHER_PID_ENV set), before any heavy
    import: bound to its parent (`die_with_parent`) and beating (`start_heartbeat`), so that the seconds of
    importing torch are supervised too. Elsewhere (a worker started by hand, a test importing it) nothing."""
    if os.environ.get(HEARTBEAT_DIR_ENV) or os.environ.get(LAUNCHER_PID_ENV):
        die_with_parent()
        start_heartbeat()


def start_heartbeat() -> None:
    """In a worker under a launcher (HEARTBEAT_DIR_ENV set): start beating. Elsewhere nothing."""
    global _heartbeat
    folder = os.environ.get(HEARTBEAT_DIR_ENV)
    if folder and _heartbeat is None and Path(folder).is_dir():
        _heartbeat = _Heartbeat(Path(folder), int(os.environ.get("RANK", "0")))


def progress(step: int | None = None) -> None:
    """The training loop finished `step` (or some other stretch of work): it is not stuck."""
    if _heartbeat is not None:
        _heartbeat.progress(step)


def finished() -> None:
    """The worker is leaving normally: its process ending is no death."""
    if _heartbeat is not None:
        _heartbeat.progress(state="done")


@dataclass
class Verdict:
    kind: str
    """'stopped' (no heartbeat), 'stuck' (alive, no progress), 'died' (process gone), 'silent' (never beat),
    'torchrun stopped' (SIGSTOP), 'torchrun hung' (alive after every rank finished); rank -1 for these two."""
    rank: int
    step: int
    """The last step the rank finished."""
    seconds: float = 0.0


def job_processes(job_id: str) -> list[int]:
    """Pids of the live processes whose environment holds job id `job_id` (this process excluded)."""
    needle = f"{JOB_ID_ENV}={job_id}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as fh:
                environ = fh.read()
        except OSError:  # gone, or not ours to read
            continue
        if needle in environ.split(b"\0"):
            found.append(int(name))
    return found


def end_job(job_id: str | None, rounds: int = 20) -> None:
    """SIGKILL every process of job `job_id` (see job_processes), again until none is left (a process forked
    while the first round ran) or `rounds` rounds passed. Nothing when `job_id` is None or not on Linux."""
    if not job_id or not os.path.isdir("/proc"):
        return
    for _ in range(rounds):
        pids = job_processes(job_id)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.05)


def _state(pid: int) -> str | None:
    """The one-letter state of `pid` ('R', 'S', 'T' stopped, 'Z' ...), None when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (exited, not yet reaped) counts as gone
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _read(path: Path):
    try:
        pid, step, progress_unix, state = path.read_text().split()
        return int(pid), int(step), float(progress_unix), state, path.stat().st_mtime
    except (OSError, ValueError):
        return None


class Monitor:
    """Watches the heartbeat files of `ranks` local workers of torchrun `proc` (see the module docstring)."""

    def __init__(self, folder: Path, ranks: range, timeout_s: float, proc, job_id: str | None = None):
        self.folder, self.ranks, self.timeout_s, self.proc = Path(folder), ranks, timeout_s, proc
        self.job_id = job_id
        """The job's id (job_env): every process carrying it is ended with the job, and swept once torchrun
        exited; None to end only torchrun's group and the ranks that beat."""
        self._torchrun_stopped_since: float | None = None
        self._all_done_since: float | None = None
        self.verdict: Verdict | None = None
        self.steps: dict[int, int] = {}
        """rank -> the last step it finished, as last read."""
        self.killed = False
        self._stop = threading.Event()
        self._started = time.time()
        self._thread = threading.Thread(target=self._loop, name="heartbeat-monitor", daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        if self.proc.poll() is not None:
            end_job(self.job_id)  # nothing of the job outlives torchrun

    def _loop(self) -> None:
        poll = min(0.2, self.timeout_s / 10)
        while not self._stop.wait(poll) and self.proc.poll() is None:
            self.check(time.time())
            if self.killed:
                return
        if self.proc.poll() is not None:
            end_job(self.job_id)  # workers orphaned by torchrun's end (they would hold its stderr open)

    def check(self, now: float) -> None:
        if self._torchrun_hung(now):
            return
        beats = {int(p.name[4:]): b for p in self.folder.glob("rank*") if p.name[4:].isdigit()
                 and (b := _read(p)) is not None}
        self.steps.update({rank: b[1] for rank, b in beats.items()})
        missing = sorted(set(self.ranks) - set(beats))
        if missing:  # a worker that never beat: counted from the launch
            if now - self._started > self.timeout_s:
                self._end(Verdict("silent", missing[0], 0, now - self._started))
            return
        self._all_done_since = (self._all_done_since or now) if beats and all(
            b[3] == "done" for b in beats.values()) else None
        for rank, (pid, step, _, state, mtime) in sorted(beats.items()):
            if state != "done" and not _alive(pid):
                if self.verdict is None:
                    self.verdict = Verdict("died", rank, step)
                return  # torchrun stops the others itself; a hang of theirs is still caught below next time
        for rank, (pid, step, _, state, mtime) in sorted(beats.items()):
            if state != "done" and now - mtime > self.timeout_s / 2:
                self._end(Verdict("stopped", rank, step, now - mtime))
                return
        running = [(step, rank, now - prog) for rank, (_, step, prog, state, _) in beats.items() if state != "done"]
        if running and min(age for _, _, age in running) > self.timeout_s:
            step, rank, age = min(running)  # the rank furthest behind
            self._end(Verdict("stuck", rank, step, age))

    def _torchrun_hung(self, now: float) -> bool:
        """torchrun stopped (SIGSTOP) for half of the timeout, or alive a whole timeout after every rank finished:
        the job is ended (returns True)."""
        stopped = _state(self.proc.pid) in ("T", "t")
        self._torchrun_stopped_since = (self._torchrun_stopped_since or now) if stopped else None
        since = self._torchrun_stopped_since if stopped else self._all_done_since
        limit = self.timeout_s / 2 if stopped else self.timeout_s
        if since is None or now - since <= limit:
            return False
        kind = "torchrun stopped" if stopped else "torchrun hung"
        self._end(Verdict(kind, -1, max(self.steps.values(), default=0), now - since))
        return True

    def _end(self, verdict: Verdict) -> None:
        """Kill torchrun (its process group), every worker that beat and every process of the job, at once: a
        hung job cannot save."""
        if self.verdict is None or self.verdict.kind == "died":
            self.verdict = verdict
        self.killed = True
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        end_job(self.job_id)
        for p in self.folder.glob("rank*"):
            b = _read(p)
            if b is not None and b[3] != "done":
                try:
                    os.kill(b[0], signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass


def root_cause(held: str) -> tuple[int | None, int | None]:
    """(rank, exit code) of the first failed worker in torchrun's report ('Root Cause ... rank : 1 ...
    exitcode : -9'); None where it does not say."""
    text = held[held.find("Root Cause"):] if "Root Cause" in held else held
    rank = re.search(r"\brank\s*:\s*(\d+)", text)
    code = re.search(r"exitcode\s*:\s*(-?\d+)", text)
    return (int(rank.group(1)) if rank else None), (int(code.group(1)) if code else None)


def _exit_description(code: int | None) -> str:
    if code is None:
        return "ended"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def verdict_sentence(verdict: Verdict, timeout_s: float, held: str, resume_from: str) -> str:
    """The one sentence for a dead or hung rank; `resume_from` names the newest checkpoint (or says none)."""
    during = f"during step {verdict.step + 1} (after step {verdict.step})" if verdict.step else "before its first step"
    if verdict.kind == "torchrun stopped":
        what = f"torchrun was stopped for {verdict.seconds:.0f} s (half of --timeout {timeout_s:g})"
    elif verdict.kind == "torchrun hung":
        what = f"torchrun did not exit {verdict.seconds:.0f} s after every rank finished (--timeout {timeout_s:g})"
    elif verdict.kind == "silent":
        what = (f"rank {verdict.rank} sent no heartbeat within {verdict.seconds:.0f} s of the launch "
                f"(--timeout {timeout_s:g})")
    elif verdict.kind == "died":
        what = f"rank {verdict.rank} {_exit_description(root_cause(held)[1])} {during}"
    elif verdict.kind == "stopped":
        what = (f"rank {verdict.rank} stopped responding {during}: no heartbeat for {verdict.seconds:.0f} s "
                f"(half of --timeout {timeout_s:g})")
    else:
        what = (f"no rank finished a step for {verdict.seconds:.0f} s (--timeout {timeout_s:g}); rank "
                f"{verdict.rank} is furthest behind, stuck {during}")
    return f"{what}; the job was ended; {resume_from}"


def exited_sentence(rc: int, resume_from: str) -> str:
    """torchrun itself ended by a signal (not one we forwarded): its workers ended with it."""
    try:
        how = f"was killed by {signal.Signals(-rc).name}"
    except ValueError:
        how = f"ended by signal {-rc}"
    return f"torchrun {how} and its workers ended with it; {resume_from}"


def resume_from(ckpt_dir) -> str:
    if not ckpt_dir:
        return "nothing was saved (no --ckpt-dir)"
    from runtime.checkpoint import complete_steps, step_dir
    steps = complete_steps(ckpt_dir)
    if not steps:
        return "no checkpoint was saved"
    return f"resume from '{step_dir(ckpt_dir, steps[-1])}' with --resume"
