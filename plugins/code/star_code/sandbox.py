"""The parent's side of one sandboxed run (``run``): a fresh working directory, removed afterwards;
a scrubbed environment; the child (``star_code.child``) in its own session, behind ``unshare``'s user,
mount, PID and network namespaces when the machine allows them (``isolation``); resource limits set
by the child before the candidate runs; a wall-clock bound past which the whole process group is
killed (in a PID namespace: every process the candidate started, whatever session it moved to); the
verdict read from a pipe only the child's harness writes a per-run random token to.

What each isolation level isolates is stated in plugins/code/README.md ("The sandbox").
"""

from __future__ import annotations

import json
import os
import secrets
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path

CHILD = str(Path(__file__).with_name("child.py"))
UNSHARE = ("--user", "--map-root-user", "--net", "--pid", "--fork", "--kill-child", "--mount", "--mount-proc")
READ_CAP = 4096  # bytes of the verdict pipe read: a token, or a short reason
SHARED_TMP = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")  # world-writable: covered in the namespaces
PIDS_ROOTS = ("/sys/fs/cgroup/pids", "/sys/fs/cgroup")  # cgroup v1's pids hierarchy, v2's root


@cache
def pids_root() -> str | None:
    """A cgroup hierarchy where this process may make a group with ``pids.max``, else None:
    RLIMIT_NPROC does not bound root's processes (nor those of root in a user namespace, as
    measured on Linux 6.18), so a fork bomb is bounded by a pids cgroup when there is one."""
    for root in PIDS_ROOTS:
        probe = os.path.join(root, f"star-code-probe-{os.getpid()}")
        try:
            os.mkdir(probe)
        except OSError:
            continue
        try:
            if os.path.exists(os.path.join(probe, "pids.max")):
                return root
        finally:
            os.rmdir(probe)
    return None


def _pids_group(limit: int) -> str | None:
    root = pids_root()
    if root is None:
        return None
    group = tempfile.mkdtemp(prefix="star-code-", dir=root)
    with open(os.path.join(group, "pids.max"), "w") as f:
        f.write(str(limit))
    return group


def _drop_group(group: str | None) -> None:
    if group is None:
        return
    for _ in range(100):  # empty once the run's last process is reaped
        try:
            os.rmdir(group)
            return
        except OSError:
            time.sleep(0.05)


@dataclass(frozen=True)
class Limits:
    """Per-run bounds: ``seconds`` wall clock; ``cpu`` CPU seconds; ``memory`` address space, bytes;
    ``file_size`` the largest file written (and the private working directory's size), bytes;
    ``open_files`` descriptors; ``processes`` processes and threads (the candidate's own user)."""

    seconds: float
    cpu: int
    memory: int
    file_size: int
    open_files: int
    processes: int


@dataclass(frozen=True)
class Outcome:
    """How a run ended: ``passed`` (the token came back and the child exited 0), else ``reason``:
    ``"failed"`` (an exception: ``detail`` names it), ``"timeout"`` (the wall clock), ``"cpu"`` (the
    CPU limit: SIGXCPU), ``"memory"`` (MemoryError), ``"signal"`` (killed by a signal: ``detail``),
    ``"exit"`` (ended without a verdict: ``detail`` the status), ``"sandbox"`` (it could not be set up).
    ``workdir``: the working directory it had (removed)."""

    passed: bool
    reason: str
    detail: str
    seconds: float
    workdir: str

    @property
    def timed_out(self) -> bool:
        return self.reason in ("timeout", "cpu")


def scrubbed_env(workdir: str) -> dict[str, str]:
    """The child's whole environment: nothing of the parent's (no tokens, paths, proxies)."""
    return {"PATH": "/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1", "PYTHONIOENCODING": "utf-8"}


def hidden_paths() -> list[str]:
    """Directories covered with an empty read-only tmpfs in the namespaces: the shared temporary
    directories, and the parent's working directory and home, unless the interpreter lives there."""
    keep = [os.path.realpath(p) for p in (sys.base_prefix, sys.executable)]  # imports read the stdlib later
    out = list(SHARED_TMP)
    for path in (os.getcwd(), os.path.expanduser("~")):
        real = os.path.realpath(path)
        if real != "/" and not any(k == real or k.startswith(real + os.sep) for k in keep):
            out.append(real)
    return out


def command(confine: bool, marker: str) -> list[str]:
    child = [sys.executable, "-I", "-S", CHILD, marker]
    return ["unshare", *UNSHARE, "--", *child] if confine else child


@cache
def namespaces_work() -> str | None:
    """None when a confined run works on this machine (``unshare`` present, user/mount/PID/network
    namespaces allowed, ``mount_setattr``), else why not. Asked once per process."""
    if shutil.which("unshare") is None:
        return "no 'unshare' command (util-linux)"
    probe = run("x = 1\n", Limits(10.0, 5, 512 << 20, 1 << 20, 64, 64), confine=True)
    return None if probe.passed else f"{probe.reason}: {probe.detail}"[:300]


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


def _stop(proc: subprocess.Popen, confine: bool) -> None:
    """End the run and wait until every process of it is gone. Confined, the child is the PID
    namespace's init: killing it kills the namespace's every process, and ``unshare`` exits once the
    kernel has reaped them all. Then the process group (all there is without namespaces)."""
    if confine and proc.poll() is None:
        for pid in _children(proc.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
    _kill_group(proc.pid)  # the child, and anything it left in its group
    proc.wait()


def _remove(path: str) -> None:
    def unlock(fn, p, exc):  # a candidate may have made things read-only
        os.chmod(os.path.dirname(p), stat.S_IRWXU)
        if os.path.isdir(p) and not os.path.islink(p):
            os.chmod(p, stat.S_IRWXU)
        shutil.rmtree(p, ignore_errors=True) if os.path.isdir(p) else os.unlink(p)
    shutil.rmtree(path, onerror=unlock)


def run(program: str, limits: Limits, confine: bool) -> Outcome:
    """Run ``program`` (the candidate and its tests) once in the sandbox; returns within about
    ``limits.seconds`` (plus start-up and clean-up)."""
    workdir = tempfile.mkdtemp(prefix="star-code-")
    token = secrets.token_hex(16)
    read_fd, write_fd = os.pipe()
    group = _pids_group(limits.processes)
    job = {"program": program, "token": token, "fd": write_fd, "confine": confine, "workdir": workdir, "cgroup": group,
           "hide": hidden_paths() if confine else [],
           "limits": {"cpu": limits.cpu, "memory": limits.memory, "file_size": limits.file_size,
                      "open_files": limits.open_files, "processes": limits.processes}}
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(command(confine, workdir), stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, pass_fds=(write_fd,), cwd=workdir,
                                env=scrubbed_env(workdir), start_new_session=True, close_fds=True)
    finally:
        os.close(write_fd)
    try:
        data, late = _exchange(proc, json.dumps(job).encode(), read_fd, t0 + limits.seconds)
    finally:
        _stop(proc, confine)
        _drop_group(group)
        os.close(read_fd)
        seconds = time.monotonic() - t0
        _remove(workdir)
    return _outcome(data, token, proc.returncode, late, seconds, workdir)


def _exchange(proc: subprocess.Popen, job: bytes, read_fd: int, deadline: float) -> tuple[bytes, bool]:
    """Send the job, then read the verdict pipe until it closes or ``deadline``: (what was read, late)."""
    assert proc.stdin is not None
    try:
        proc.stdin.write(job)
        proc.stdin.close()
    except (BrokenPipeError, OSError):
        pass
    data = b""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return data, True
        ready, _, _ = select.select([read_fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(read_fd, READ_CAP)
        if not chunk:  # every writer is gone: the child ended
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                return data, True
            return data, False
        data = (data + chunk)[:READ_CAP]


def _outcome(data: bytes, token: str, code: int | None, late: bool, seconds: float, workdir: str) -> Outcome:
    def out(reason: str, detail: str = "") -> Outcome:
        return Outcome(False, reason, detail, seconds, workdir)

    if late:
        return out("timeout", f"no verdict within the wall clock ({seconds:.2f} s)")
    if code == 0 and data == token.encode():
        return Outcome(True, "passed", "", seconds, workdir)
    text = data.decode("utf-8", "replace")
    if text.startswith("S:"):
        return out("sandbox", text[2:])
    if text.startswith("F:MemoryError"):
        return out("memory", "MemoryError")
    if text.startswith("F:"):
        return out("failed", text[2:100])
    if code is not None and code < 0:
        sig = signal.Signals(-code).name if -code in signal.valid_signals() else str(-code)
        return out("cpu", sig) if sig == "SIGXCPU" else out("signal", sig)
    return out("exit", f"exit status {code}")
