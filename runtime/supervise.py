"""Supervision of torchrun and its workers: nobody outlives the launcher, and a dead or hung rank ends the job.

Parent-death signal: `plan launch` and `plan validate` start torchrun with PR_SET_PDEATHSIG = SIGKILL (Linux,
through ctypes, set in the child before exec), and every worker sets the same on itself as it starts
(`die_with_parent`); so `kill -9` of the launcher takes torchrun with it, and torchrun's death takes its
workers (torchrun starts each in a session of its own, so a process-group kill would miss them). Elsewhere a
watchdog thread polls os.getppid() once a second and ends the process when its parent changed.

Heartbeats: under a launcher, every worker runs a thread that rewrites HEARTBEAT_DIR/rank<r> once a second with
its pid, the last step it finished and when it last made progress (`progress(step)`, called by the training
loop after each step and save). The launcher's `Monitor` reads them: a rank whose file stopped changing for
half of --timeout is not running (stopped, frozen); a live rank that made no progress for --timeout is stuck
(a collective that never completes); a rank whose process is gone without saying it finished died. In the
first two cases the monitor kills torchrun and the workers at once; a death is left to torchrun, which stops
the others itself. Either way the launcher then prints one sentence naming the rank, the step and the newest
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
from dataclasses import dataclass
from pathlib import Path

HEARTBEAT_DIR_ENV = "PLAN_HEARTBEAT_DIR"
"""Environment variable naming the folder of the workers' heartbeat files (set by the launcher)."""
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


def die_with_parent() -> None:
    """A worker ends when the process that started it (torchrun) ends, whatever killed it."""
    parent = os.getppid()
    if _set_pdeathsig(signal.SIGKILL):
        if os.getppid() != parent:  # the parent died before the signal was armed
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
    """'stopped' (no heartbeat), 'stuck' (alive, no progress), 'died' (process gone)."""
    rank: int
    step: int
    """The last step the rank finished."""
    seconds: float = 0.0


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

    def __init__(self, folder: Path, ranks: range, timeout_s: float, proc):
        self.folder, self.ranks, self.timeout_s, self.proc = Path(folder), ranks, timeout_s, proc
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

    def _loop(self) -> None:
        poll = min(0.2, self.timeout_s / 10)
        while not self._stop.wait(poll) and self.proc.poll() is None:
            self.check(time.time())
            if self.killed:
                return

    def check(self, now: float) -> None:
        beats = {int(p.name[4:]): b for p in self.folder.glob("rank*") if p.name[4:].isdigit()
                 and (b := _read(p)) is not None}
        self.steps.update({rank: b[1] for rank, b in beats.items()})
        missing = sorted(set(self.ranks) - set(beats))
        if missing:  # a worker that never beat: counted from the launch
            if now - self._started > self.timeout_s:
                self._end(Verdict("stopped", missing[0], 0, now - self._started))
            return
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

    def _end(self, verdict: Verdict) -> None:
        """Kill torchrun (its process group) and every worker that beat, at once: a hung job cannot save."""
        if self.verdict is None or self.verdict.kind == "died":
            self.verdict = verdict
        self.killed = True
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
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
    if verdict.kind == "died":
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
