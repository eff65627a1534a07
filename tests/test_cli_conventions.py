"""The command line's conventions (issue 31, item 7), each in a real process: ``--version``; the
bare command lists every command, the backend's included, and is a usage error; every positional
argument has help text. (``plugins``' exit code with a broken plugin: test_plugin_failures.py;
``plan EXPERIMENT``: backends/haiku_xmap/tests/test_plan.py.)"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from importlib import metadata

import pytest


def star(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STAR_ENGINE_")}  # the installed plugins
    return subprocess.run([sys.executable, "-m", "star_engine", *args], capture_output=True, text=True, env=env,
                          timeout=300)


def test_version():
    res = star("--version")
    assert res.returncode == 0 and res.stdout == f"star-engine {metadata.version('star-engine')}\n"


def test_the_bare_command_lists_every_command_and_is_a_usage_error():
    res = star()
    assert res.returncode == 2 and res.stdout == ""
    usage = re.search(r"\{([\w,]+)\}", res.stderr).group(1).split(",")
    assert {"run", "validate", "plugins", "report", "export", "data", "show", "status", "convert", "plan"} <= set(usage)
    for command in usage:  # each with its one line of help
        assert re.search(rf"^    {command} +\w", res.stderr, re.MULTILINE), (command, res.stderr)
    assert star("--help").stdout.split("\n\n", 1)[1] == res.stderr.split("\n\n", 1)[1]


@pytest.mark.parametrize("command", ["run", "validate", "report", "export", "data check", "show", "status", "plan",
                                     "convert"])
def test_every_positional_argument_has_help(command):
    res = star(*command.split(), "--help")
    assert res.returncode == 0, res.stderr
    positional = res.stdout.split("positional arguments:", 1)[1].split("\n\n", 1)[0] \
        if "positional arguments:" in res.stdout else ""
    names = re.findall(r"^  (\w+)( +\S.*)?$", positional, re.MULTILINE)
    assert names, res.stdout
    for name, text in names:
        assert text.strip() or re.search(rf"^  {name}\n {{10,}}\S", positional, re.MULTILINE), (command, name)


def test_report_says_what_its_argument_is():
    assert "a run directory (an experiment's output_dir" in star("report", "--help").stdout
