"""What ``star-engine run`` writes where, as a process: the narrative (events, progress, the
summary table) on stdout, warnings and errors on stderr; without a terminal (a file, a pipe)
progress lines at an interval and the whole table; on a terminal a live bar and a table that
fits its width (a real pseudo-terminal, 80 columns and wider)."""

from __future__ import annotations

import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from star_engine.errors import UserError
from star_engine.ui import LineProgress, progress_interval
from star_testkit import TOY_TOML, cli, scripted_env

FULL_HEADERS = ("iteration", "split", "accuracy", "correct", "rationalized", "kept", "steps", "coverage")
PROGRESS = re.compile(r"^\S+Z \[progress \] (.+?): (\d+)/(\d+) (\w+), (\d+)%, .*?, (\d+:\d\d:\d\d) elapsed, "
                      r"(?:(\d+:\d\d:\d\d) left|done)$")


def toy(tmp_path: Path, iterations: int = 1) -> Path:
    path = tmp_path / "toy.toml"
    path.write_text(TOY_TOML.format(out=(tmp_path / "run").as_posix()).replace("iterations = 3",
                                                                               f"iterations = {iterations}"))
    return path


def table_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line[:1] and line[0] in "┏┃┡│└"]


def test_a_run_redirected_to_a_file_logs_there_with_progress_and_the_whole_table(tmp_path):
    """``star-engine run X > log.txt``: the file holds the run's log, progress included;
    stderr stays empty (nothing needed attention)."""
    log = tmp_path / "log.txt"
    with open(log, "w") as out:
        res = subprocess.run([sys.executable, "-m", "star_engine", "run", str(toy(tmp_path))], stdout=out,
                             stderr=subprocess.PIPE, text=True, timeout=300,
                             env=scripted_env(SCRIPTED_SLEEP="0.01", STAR_ENGINE_PROGRESS_INTERVAL="0.03"))
    assert res.returncode == 0 and res.stderr == "", res.stderr
    text = log.read_text()
    assert "[info     ] start" in text and "iteration_done" in text and "run_finished" in text
    lines = [m.groups() for m in map(PROGRESS.match, text.splitlines()) if m]
    stages = {stage for stage, *_ in lines}
    assert stages == {"iter 0: evaluate dev", "iter 1: generate", "iter 1: rationalize", "iterations/001: train",
                      "iter 1: evaluate dev"}
    for stage in stages:
        done = [g for g in lines if g[0] == stage]
        assert done[-1][1] == done[-1][2] and done[-1][6] is None  # the stage's last line: all done
        assert all(g[6] is not None for g in done[:-1])  # the others say the time left
    assert {g[3] for g in lines if g[0].endswith("train")} == {"steps"}
    assert any(g[6] is not None for g in lines if g[0] == "iter 1: generate")  # a line before the end
    # The summary table, whole: every header, nothing cut, wider than 80 columns if it needs.
    table = table_lines(text)
    assert table and all(h in table[1] for h in FULL_HEADERS) and "…" not in "".join(table)
    assert text.index("run_finished") < text.index("STaR run summary")


def test_a_pipe_gets_the_same_and_warnings_go_to_stderr(tmp_path):
    """A damaged file found on resume is a warning: on stderr, not in the log on stdout."""
    path = toy(tmp_path)
    assert cli("run", str(path), "--quiet").returncode == 0
    victim = tmp_path / "run" / "iterations/001/generated.parquet"
    victim.write_bytes(victim.read_bytes()[:-7] + b"garbage")
    res = cli("run", str(path))  # pipes: no terminal
    assert res.returncode == 0, res.stderr
    assert "damaged_artifact" in res.stderr and str(victim) in res.stderr
    assert "damaged_artifact" not in res.stdout and "[info     ] resume" in res.stdout
    assert "iter 1: generate: 24/24 prompts, 100%" in res.stdout  # the stage redone, with its progress
    assert table_lines(res.stdout) and not table_lines(res.stderr)


def test_a_reader_that_leaves_does_not_stop_the_run(tmp_path):
    """``star-engine run X | head -1``: the run goes on to its end (exit 0), its console silenced."""
    proc = subprocess.Popen([sys.executable, "-m", "star_engine", "run", str(toy(tmp_path, iterations=2))],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=scripted_env(SCRIPTED_SLEEP="0.01"))
    assert b"[info     ] start" in proc.stdout.readline()
    proc.stdout.close()  # the reader leaves
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 0, err
    assert err == ("warning: stdout was closed; the command goes on without its console output (a run's events "
                   "are in RUN_DIR/events.jsonl)\n")
    events = (tmp_path / "run" / "events.jsonl").read_text()
    assert '"event": "run_finished"' in events and (tmp_path / "run" / "iterations/002/metrics.parquet").is_file()


def test_quiet_leaves_errors_only(tmp_path):
    res = cli("run", str(toy(tmp_path)), "--quiet")
    assert res.returncode == 0 and res.stdout == "" and res.stderr == ""
    (tmp_path / "run" / "config.json").write_text("{")
    res = cli("run", str(toy(tmp_path)), "--quiet")
    assert res.returncode == 2 and res.stdout == "" and res.stderr.startswith("error: ")


@pytest.mark.parametrize("value", ["soon", "-1", "nan", "inf"])
def test_a_bad_progress_interval_is_one_line_exit_2_nothing_written(tmp_path, value):
    res = cli("run", str(toy(tmp_path)), env=scripted_env(STAR_ENGINE_PROGRESS_INTERVAL=value))
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr == (f"error: STAR_ENGINE_PROGRESS_INTERVAL: must be a number of seconds >= 0 (0: a line at "
                          f"every update), got {value!r}\n")
    assert not (tmp_path / "run").exists()


def test_the_interval_is_read_strictly():
    assert progress_interval({}) is None and progress_interval({"STAR_ENGINE_PROGRESS_INTERVAL": " "}) is None
    assert progress_interval({"STAR_ENGINE_PROGRESS_INTERVAL": "2.5"}) == 2.5
    with pytest.raises(UserError):
        progress_interval({"STAR_ENGINE_PROGRESS_INTERVAL": "10s"})


def lines_at(total: int, every: float, interval: float | None) -> list[tuple[float, str]]:
    """When LineProgress writes, for ``total`` units one every ``every`` seconds (a fake clock)."""
    now = [0.0]
    out: list[tuple[float, str]] = []
    p = LineProgress("iter 1: generate", total, "prompt", interval, lambda s: out.append((now[0], s)),
                     clock=lambda: now[0])
    for _ in range(total):
        now[0] += every
        p.advance()
    p.finish()
    return out


def test_the_adaptive_interval_grows_with_the_stage_and_is_capped():
    out = lines_at(20_000, 1.0, None)  # 5.5 hours, a unit a second
    times = [t for t, _ in out]
    gaps = [b - a for a, b in zip(times, times[1:-1])]
    assert times[0] == 10 and gaps[:9] == [10] * 9  # every 10 s at first
    assert all(g >= min(300, max(10, a / 10)) for g, a in zip(gaps, times))  # a tenth of the time so far
    assert max(gaps) == 300 and gaps[-1] == 300  # at most 5 minutes between lines
    assert 90 < len(out) < 120  # ~100 lines for 5.5 hours, not 20,000
    assert out[-1][1].endswith("20000/20000 prompts, 100%, 1.0 prompts/s, 5:33:20 elapsed, done")
    assert out[0][1].endswith("iter 1: generate: 10/20000 prompts, 0%, 1.0 prompts/s, 0:00:10 elapsed, 5:33:10 left")


def test_a_fixed_interval_and_slow_units():
    assert len(lines_at(5, 1.0, 0)) == 5  # 0: every update (the last one as the final line)
    out = lines_at(3, 40.0, None)
    assert [t for t, _ in out] == [40, 80, 120]
    assert out[0][1].endswith("1/3 prompts, 33%, 0:00:40 elapsed, "
                              "time left estimated after the first batch (it includes compilation)")
    assert out[1][1].endswith("2/3 prompts, 67%, 40.0 s/prompt, 0:01:20 elapsed, 0:00:40 left")
    (only,) = lines_at(1, 0.0, None)  # instant: the final line alone
    assert only[1].endswith("iter 1: generate: 1/1 prompt, 100%, 0:00:00 elapsed, done")


def test_the_first_batch_holds_the_compilation_and_is_left_out_of_the_rate():
    """A first report after 100 s (the step compiled), then a unit a second: the estimate is
    the steady second per unit, not 100 s per unit (issue #43: '31.8 s/prompt, 0:03:42 left'
    printed for a stage that ended 5 s later)."""
    now = [0.0]
    out: list[str] = []
    p = LineProgress("iter 1: generate", 120, "prompt", 0, out.append, clock=lambda: now[0])
    now[0] = 100.0
    p.advance(8)
    now[0] = 110.0
    p.advance(10)
    assert out[0].endswith("8/120 prompts, 7%, 0:01:40 elapsed, "
                           "time left estimated after the first batch (it includes compilation)")
    assert out[1].endswith("18/120 prompts, 15%, 1.0 prompts/s, 0:01:50 elapsed, 0:01:42 left")


def test_the_last_line_counts_the_stage_done_when_the_backend_reports_no_progress():
    out: list[str] = []
    LineProgress("iter 1: evaluate dev", 12, "prompt", None, out.append, clock=lambda: 3.0).finish()
    assert len(out) == 1 and out[0].endswith("iter 1: evaluate dev: 12/12 prompts, 100%, 0:00:00 elapsed, done")


def run_in_terminal(args: list[str], columns: int, tmp_path: Path) -> str:
    """``star-engine ARGS`` on a pseudo-terminal of ``columns`` columns; its output, ANSI codes removed."""
    master, slave = pty.openpty()
    termios_size = struct.pack("HHHH", 40, columns, 0, 0)
    import fcntl

    fcntl.ioctl(slave, termios.TIOCSWINSZ, termios_size)
    env = scripted_env(TERM="xterm")
    for var in ("COLUMNS", "LINES", "NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        env.pop(var, None)
    proc = subprocess.Popen([sys.executable, "-m", "star_engine", *args], stdin=slave, stdout=slave, stderr=slave,
                            env=env, cwd=tmp_path)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    assert proc.wait(timeout=300) == 0
    text = b"".join(chunks).decode("utf-8", "replace").replace("\r\n", "\n")
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)


def test_on_an_80_column_terminal_the_table_fits_with_a_legend(tmp_path):
    text = run_in_terminal(["run", str(toy(tmp_path))], 80, tmp_path)
    table = table_lines(text)
    assert table and max(len(line) for line in table) <= 80 and "…" not in "".join(table)
    assert re.search(r"┃ +it ┃ +split ┃ +acc ┃ +n ┃ +right ┃ +rat ┃ +kept ┃ +steps ┃ +cov ┃", table[1])
    legend = " ".join(text[text.index("└"):].split())
    assert "it = iteration, acc = accuracy, right = answered right, rat = rationalized (right only with the hint)" \
        in legend
    assert "iter 1: generate" in text and "[progress ]" not in text  # a live bar, not lines


def test_on_a_wide_terminal_the_table_is_whole(tmp_path):
    text = run_in_terminal(["run", str(toy(tmp_path))], 120, tmp_path)
    table = table_lines(text)
    assert all(h in table[1] for h in FULL_HEADERS) and "rat =" not in text


def render(table, width: int) -> str:
    import io

    from rich.console import Console

    buf = io.StringIO()
    Console(file=buf, width=width).print(table)
    return buf.getvalue()


def test_the_table_marks_a_smoke_iteration_trained_on_gold_and_missing_values():
    from star_engine.ui import summary_table

    rows = [{"iteration": 0, "split": "dev", "class": "all", "accuracy": 0.0, "n": 8, "correct": None},
            {"iteration": 1, "split": "train", "class": "all", "accuracy": 0.0, "n": 8, "correct": 0,
             "rationalized": 0, "kept": 0, "train_steps": 3, "coverage": 0.0, "trained_on": "gold_fallback"},
            {"iteration": 1, "split": "train", "class": "1", "accuracy": 0.5, "n": 2, "correct": 1,
             "rationalized": 0, "kept": 0, "train_steps": 3, "coverage": 0.0}]  # a class: not in the table
    for short, width in ((False, 200), (True, 80)):
        text = render(summary_table(rows, short=short), width)
        lines = table_lines(text)
        cells = [[c.strip() for c in line.strip("│").split("│")] for line in lines if line[0] == "│"]
        assert cells == [["0", "dev", "0.0%", "8", "–", "", "", "", ""],  # –: a value the row lacks
                         ["1", "train", "0.0%", "8", "0", "0", "0", "3*", "0.0%"]]
        assert "* trained on the task's gold completions: nothing was kept" in " ".join(text.split())
    plain = [{**rows[1], "trained_on": "kept"}]
    assert "*" not in render(summary_table(plain), 200)


def test_the_machine_a_run_ran_on_is_named_with_its_wall_time(tmp_path):
    """The run's summary ends with the CPU model (as lscpu names it) and this command's wall time."""
    from star_engine.machine import clock, cpu_model

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC   7B13 64-Core Processor\n")
    assert cpu_model(info) == "AMD EPYC 7B13 64-Core Processor"
    info.write_text("processor\t: 0\nBogoMIPS\t: 50.00\nModel\t\t: Raspberry Pi 4 Model B Rev 1.4\n")
    assert cpu_model(info) == "Raspberry Pi 4 Model B Rev 1.4"
    assert cpu_model(tmp_path / "absent")  # platform's words, never empty
    assert (clock(41.2), clock(820.4), clock(7530)) == ("41 s", "13 min 40 s", "2 h 05 min")


def test_the_run_prints_its_expected_time_from_the_measured_speed_and_names_the_speed(tmp_path):
    """experiment.expected_minutes at expected_gflops, scaled by the speed the backend measured at
    start (Backend.matmul_gflops), printed before training; the summary's machine line names the
    speed; run_finished records it; without a measured speed neither is printed."""
    import json

    path = toy(tmp_path)
    text = path.read_text().replace("[experiment]\n", "[experiment]\nexpected_minutes = 9\nexpected_gflops = 350\n", 1)
    path.write_text(text)
    r = cli("run", str(path), env=scripted_env(SCRIPTED_GFLOPS="175"))
    assert r.returncode == 0, r.stderr
    out = " ".join(r.stdout.split())
    assert "expected: ~18 min 0 s on this CPU" in out and "175 fp32 GFLOP/s measured now; 9 min 0 s at 350" in out
    assert out.index("expected: ~18 min") < out.index("STaR run summary")
    assert re.search(r"ran on .+ \(\d+ CPUs?, 175 fp32 GFLOP/s\): \d+ s wall", out)
    events = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    assert [e["gflops"] for e in events if e["event"] == "run_finished"] == [175.0]
    assert [e["gflops"] for e in events if e["event"] == "machine_speed"] == [175.0]

    (tmp_path / "again").mkdir()
    r = cli("run", str(toy(tmp_path / "again")), env=scripted_env())  # the speed is not measured: no estimate
    assert r.returncode == 0, r.stderr
    assert "expected:" not in r.stdout and "GFLOP/s" not in r.stdout


@pytest.mark.parametrize("key", ["expected_minutes", "expected_gflops"])
def test_an_expected_time_needs_both_figures(tmp_path, key):
    path = toy(tmp_path)
    r = cli("run", str(path), "--set", f"experiment.{key}=9")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and f"experiment.{key}: needs" in r.stderr
    assert not (tmp_path / "run").exists()
