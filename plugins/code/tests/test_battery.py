"""The hostile-code battery: each candidate is judged wrong, the test process is unharmed, no process
of the run is left, and nothing is written outside the run's temporary directory (which is removed).
Small limits (1 s) keep it fast: the four that run to the clock take about 1 s each."""

from __future__ import annotations

import os
import signal
import tempfile
from pathlib import Path

import pytest

from star_code.checker import PythonTestsChecker, gold_answer
from star_code.sandbox import namespaces_work, pids_root

GOLD = gold_answer("", "assert f(2) == 3\nassert f(10) == 11")
RIGHT = "def f(x):\n    return x + 1\n"
OUTSIDE = Path(tempfile.gettempdir()) / "star_code_battery_escape"
SECRET = Path(__file__).with_name("secret_of_the_parent.txt")  # written by the test, mode 0600

HOSTILE = {
    "infinite_loop": "while True:\n    pass\n",
    "fork_bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
    "fork_and_count": "import os, time\nn = 0\nfor i in range(100):\n    try:\n        pid = os.fork()\n"
                      "    except OSError:\n        continue\n    if pid == 0:\n        time.sleep(30)\n        os._exit(0)\n"
                      "    n += 1\nassert n < 8\nf = lambda x: x\n",
    "memory_hog": "hog = bytearray(8 << 30)\n" + RIGHT,
    "huge_output": "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n",
    "write_outside": f"open({str(OUTSIDE)!r}, 'w').write('escaped')\n" + RIGHT,
    "write_home": "import os\nopen(os.path.expanduser('~/star_code_escape'), 'w').write('x')\n" + RIGHT,
    "read_parent_file": f"SECRET = open({str(SECRET)!r}).read()\n" + RIGHT,
    "open_socket": "import socket\ns = socket.create_connection(('1.1.1.1', 80), timeout=0.5)\n" + RIGHT,
    "kill_parent": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.kill(-1, signal.SIGKILL)\n" + RIGHT,
    "sleep_past_timeout": "import time\ntime.sleep(30)\n" + RIGHT,
    "print_passed": "print('PASSED')\nprint('passed')\ndef f(x):\n    return x\n",
    "sys_exit_0": "import sys\nsys.exit(0)\n",
    "os_exit_0": "import os\nos._exit(0)\n",
    "patch_assert": "import builtins\nbuiltins.AssertionError = type('Quiet', (Exception,), {})\ndef f(x):\n    return x\n",
    "system_exit_in_test": "def f(x):\n    raise SystemExit(0)\n",
    "delete_own_tests": "import os, glob\nfor p in glob.glob('*') + glob.glob('/tmp/star-code-*/*'):\n    os.remove(p)\n"
                        "def f(x):\n    return x\n",
    "unicode_and_null": "def f(x):\n    return x  # \u00e9\u4e2d\U0001f600\x00\n",
    "thread_left_running": "import threading, time\nthreading.Thread(target=time.sleep, args=(60,)).start()\n"
                           "def f(x):\n    return x\n",
    "setsid_child": "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\n"
                    "def f(x):\n    return x\n",
}


def leftovers(marker: str) -> list[int]:
    """Processes whose command line names the run's working directory (the child and its forks)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    out.append(int(entry.name))
            except OSError:
                pass
    return out


@pytest.fixture(scope="module")
def checker():
    return PythonTestsChecker(timeout_seconds=1.0, cpu_seconds=1, memory_mb=512, file_size_mb=1, processes=8)


@pytest.fixture(scope="module", autouse=True)
def secret():
    SECRET.write_text("the parent's secret")
    SECRET.chmod(0o600)
    yield
    SECRET.unlink()


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_code_is_wrong_and_leaves_nothing(checker, name):
    if name == "fork_bomb" and pids_root() is None and os.geteuid() == 0:
        pytest.skip("no pids cgroup to make: a fork bomb of root is bounded by the wall clock only")
    if checker.isolation != "namespaces" and name in ("fork_bomb", "kill_parent", "write_outside", "write_home",
                                                       "read_parent_file", "open_socket", "setsid_child"):
        pytest.skip(f"isolation 'process' does not contain this ({namespaces_work()})")
    out = checker.outcome(HOSTILE[name] + "\n" + "assert f(2) == 3\nassert f(10) == 11\n")
    assert not out.passed, (name, out)
    # the clock, start-up and clean-up; a fork bomb's namespace takes seconds to be torn down on a loaded machine
    assert out.seconds < 1.0 + (12.0 if name == "fork_bomb" else 3.0), out
    assert not Path(out.workdir).exists()
    assert leftovers(out.workdir) == []
    assert not OUTSIDE.exists() and not Path("~/star_code_escape").expanduser().exists()
    assert checker.check(RIGHT, RIGHT, GOLD).correct  # the checker, and this process, still work


def test_why_each_run_ended_is_recorded(checker):
    seen = {}
    for name in ("infinite_loop", "memory_hog", "sys_exit_0", "os_exit_0", "system_exit_in_test"):
        seen[name] = checker.outcome(HOSTILE[name] + "\nassert f(2) == 3\n").reason
    assert seen["infinite_loop"] in ("timeout", "cpu")
    assert seen["memory_hog"] == "memory"
    assert seen["sys_exit_0"] == "failed" and seen["system_exit_in_test"] == "failed"
    assert seen["os_exit_0"] == "exit"
    v = checker.check(HOSTILE["sleep_past_timeout"], HOSTILE["sleep_past_timeout"], GOLD)
    assert v.timed_out and not v.correct
    assert checker.counts["timeout"] + checker.counts["cpu"] >= 2 and checker.counts["memory"] >= 1
    segv = checker.outcome("import ctypes\nctypes.string_at(0)\n")
    assert (segv.reason, segv.detail) == ("signal", "SIGSEGV")


def test_a_right_candidate_passes_and_a_wrong_one_fails(checker):
    assert checker.check(RIGHT, RIGHT, GOLD).correct
    assert not checker.check("def f(x):\n    return x\n", "def f(x):\n    return x\n", GOLD).correct
    assert not checker.check("", None, GOLD).correct
    assert not checker.check("def f(x) return", "def f(x) return", GOLD).correct  # a syntax error


def test_workers_run_at_once_and_keep_the_order():
    c = PythonTestsChecker(timeout_seconds=2.0, workers=min(2, len(os.sched_getaffinity(0))))
    items = [(p, p, GOLD) for p in (RIGHT, "def f(x):\n    return x\n") * 3]
    assert [v.correct for v in c.check_many(items)] == [True, False] * 3
    assert c.counts["passed"] == 3 and c.counts["failed"] == 3


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="POSIX only")
def test_the_token_is_not_in_the_candidates_reach_by_output():
    """Writing the parent's expected message to every descriptor does not pass: the token is random."""
    c = PythonTestsChecker(timeout_seconds=2.0)
    forge = "import os\nfor fd in range(3, 64):\n    try:\n        os.write(fd, b'0' * 32)\n    except OSError:\n" \
            "        pass\nos._exit(0)\n"
    assert not c.check(forge, forge, GOLD).correct
