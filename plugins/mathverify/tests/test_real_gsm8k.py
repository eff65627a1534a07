"""The real GSM8K test split's gold solutions are right under all three GSM8K checkers (needs
``../shared/data``; skipped without it): ``math_verify`` on the gold's final number as written
("1,080"), ``gsm8k_strict`` and ``gsm8k_flexible`` on the whole gold solution, each against the
``gsm8k`` task's gold answer ("1080"), every gold screened once by ``check_gold`` first."""

from __future__ import annotations

import pytest
from star_testkit import SHARED_DATA

from star_gsm8k.lmeval import FlexibleChecker, StrictChecker
from star_gsm8k.task import GSM8KTask
from star_mathverify.checker import MathVerifyChecker

REAL = SHARED_DATA / "gsm8k"


@pytest.mark.real_data
@pytest.mark.skipif(not REAL.is_dir(), reason="shared/data is absent")
def test_gold_solutions_are_right_under_every_gsm8k_checker():
    examples = GSM8KTask().load("test", str(REAL / "test.jsonl"))
    assert len(examples) == 1319
    mv, strict, flexible = MathVerifyChecker(timeout_seconds=30.0), StrictChecker(), FlexibleChecker()
    try:
        wrong = []
        for ex in examples:
            solution = ex.fields["solution"]
            final = solution.split("#### ")[-1]
            assert mv.check_gold(ex.answer)
            verdicts = {"math_verify": mv.check(final, None, ex.answer),
                        "gsm8k_strict": strict.check(solution, None, ex.answer),
                        "gsm8k_flexible": flexible.check(solution, None, ex.answer)}
            wrong += [(ex.id, name, v) for name, v in verdicts.items() if not v.correct or v.timed_out]
        assert wrong == []
        assert mv.worker.starts == 1  # no answer needed a restart
    finally:
        mv.close()
