"""The ``star-engine`` entry runs itself again once with glibc's huge-page
tunable (same pid, same arguments), unless opted out or already set."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from star_engine import launch

GLIBC = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"


@pytest.mark.skipif(not GLIBC, reason="glibc tunables")
def test_environment_gains_the_tunable_once():
    env = launch.hugepages_environ({"PATH": "/bin"}, accelerator=False)
    assert env == {"PATH": "/bin", "GLIBC_TUNABLES": launch.HUGETLB}
    assert launch.hugepages_environ(env) is None  # the second run does not exec again
    kept = launch.hugepages_environ({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, accelerator=False)
    assert kept["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:" + launch.HUGETLB
    assert launch.hugepages_environ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}) is None  # the user's choice
    assert launch.hugepages_environ({launch.OPT_OUT: "0"}) is None


def test_an_accelerator_keeps_the_cpu_tuning_off(tmp_path):
    """On a machine with a GPU or TPU the entry never re-execs for huge pages (XLA:CPU's tuning)."""
    assert launch.hugepages_environ({"PATH": "/bin"}, accelerator=True) is None
    fake = tmp_path / "nvidiactl"
    assert not launch.accelerator_present((str(fake),))
    fake.write_text("")
    assert launch.accelerator_present((str(fake),))
    assert launch.accelerator_present() == any(os.path.exists(d) for d in launch.ACCELERATOR_DEVICES)


_CHILD = """
import os, sys
print("start", os.getpid(), os.environ.get("GLIBC_TUNABLES"), sys.argv[1:], flush=True)
from star_engine.launch import with_hugepages
with_hugepages()
print("after", os.getpid(), os.environ.get("GLIBC_TUNABLES"), sys.argv[1:], flush=True)
"""


@pytest.mark.skipif(not GLIBC, reason="glibc tunables")
@pytest.mark.parametrize("opt_out", [False, True])
def test_the_command_runs_again_in_the_same_process(opt_out):
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", launch.OPT_OUT)}
    if opt_out:
        env[launch.OPT_OUT] = "0"
    out = subprocess.run([sys.executable, "-c", _CHILD, "x", "--y"], env=env, capture_output=True, text=True,
                         timeout=60, check=True).stdout.split("\n")
    lines = [l.split(" ", 3) for l in out if l]
    pid = lines[0][1]
    if opt_out:
        assert lines == [["start", pid, "None", "['x', '--y']"], ["after", pid, "None", "['x', '--y']"]]
    else:
        assert lines == [["start", pid, "None", "['x', '--y']"], ["start", pid, launch.HUGETLB, "['x', '--y']"],
                         ["after", pid, launch.HUGETLB, "['x', '--y']"]]
