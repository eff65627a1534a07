"""lm-evaluation-harness's GSM8K scoring reproduced: ``gsm8k_strict`` ("strict-match") and
``gsm8k_flexible`` ("flexible-extract"), on lm-eval's own examples.

Where the examples come from (EleutherAI/lm-evaluation-harness):
- ``lm_eval/tasks/gsm8k/gsm8k-cot.yaml`` (task ``gsm8k_cot``, version 3.0): its eight few-shot
  exemplars, each ``target`` a chain of thought ending "The answer is N." (``COT_TARGETS``
  below, copied from the file);
- ``lm_eval/tasks/gsm8k/gsm8k.yaml`` (task ``gsm8k``, version 3.0): ``doc_to_target`` is the data
  set's whole answer field, so a model that writes a target verbatim writes GSM8K's own solution
  format (``NATALIA``: the first row of GSM8K's train split, lm-eval's first few-shot candidate);
- ``../shared/REFERENCE.md`` ("Answer checking as the field does it"): " 48+24 = 72. The answer is
  72." (strict "[invalid]", flexible right) and "$1,072.00." (flexible wrong: "1072.00" is not
  "1072").
The real test split's gold solutions under both rules are in ``test_real_gold_solutions``
(``../shared/data``; skipped without it) and, with math_verify, in
``plugins/mathverify/tests/test_real_gsm8k.py``.
"""

from __future__ import annotations

import json
import re

import pytest
from star_testkit import SHARED_DATA

from star_engine import PluginError, Registry, UserError
from star_gsm8k import plugin
from star_gsm8k.lmeval import FLEXIBLE, REGEXES_TO_IGNORE, STRICT, FlexibleChecker, StrictChecker, exact_match
from star_gsm8k.task import GSM8KTask

REAL = SHARED_DATA / "gsm8k"

COT_TARGETS = [  # gsm8k-cot.yaml, fewshot_config.samples[*].target, with each question's answer
    ("There are 15 trees originally. Then there were 21 trees after some more were planted. So there must have "
     "been 21 - 15 = 6. The answer is 6.", "6"),
    ("There are originally 3 cars. 2 more cars arrive. 3 + 2 = 5. The answer is 5.", "5"),
    ("Originally, Leah had 32 chocolates. Her sister had 42. So in total they had 32 + 42 = 74. After eating 35, "
     "they had 74 - 35 = 39. The answer is 39.", "39"),
    ("Jason started with 20 lollipops. Then he had 12 after giving some to Denny. So he gave Denny 20 - 12 = 8. "
     "The answer is 8.", "8"),
    ("Shawn started with 5 toys. If he got 2 toys each from his mom and dad, then that is 4 more toys. 5 + 4 = 9. "
     "The answer is 9.", "9"),
    ("There were originally 9 computers. For each of 4 days, 5 more computers were added. So 5 * 4 = 20 computers "
     "were added. 9 + 20 is 29. The answer is 29.", "29"),
    ("Michael started with 58 golf balls. After losing 23 on tuesday, he had 58 - 23 = 35. After losing 2 more, "
     "he had 35 - 2 = 33 golf balls. The answer is 33.", "33"),
    ("Olivia had 23 dollars. 5 bagels for 3 dollars each will be 5 x 3 = 15 dollars. So she has 23 - 15 dollars "
     "left. 23 - 15 is 8. The answer is 8.", "8"),
]
NATALIA = ("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips altogether "
           "in April and May.\n#### 72")


def test_the_rules_are_lm_evals_text():
    """The patterns and the metric's regexes as the task files write them (YAML unescaped)."""
    assert STRICT == {"gsm8k": "#### (\\-?[0-9\\.\\,]+)", "gsm8k_cot": "The answer is (\\-?[0-9\\.\\,]+)."}
    assert FLEXIBLE == "(-?[$0-9.,]{2,})|(-?[0-9]+)"
    assert REGEXES_TO_IGNORE == (",", "\\$", "(?s).*#### ", "\\.$")


@pytest.mark.parametrize("target,answer", COT_TARGETS)
def test_cot_exemplars(target, answer):
    """gsm8k_cot's own exemplars: its strict rule and the flexible one read the answer; the plain
    gsm8k strict rule finds no "####" ("[invalid]", wrong). The flexible match keeps the final
    period ("6."), which the metric's "\\.$" removes."""
    cot, strict, flexible = StrictChecker(variant="gsm8k_cot"), StrictChecker(), FlexibleChecker()
    assert cot.check(target, None, answer).predicted == answer and cot.check(target, None, answer).correct
    assert flexible.check(target, None, answer).predicted == answer + "."
    assert flexible.check(target, None, answer).correct
    v = strict.check(target, None, answer)
    assert v.predicted is None and not v.correct
    assert not cot.check(target, None, str(int(answer) + 1)).correct


def test_gsm8k_targets_and_reference_examples():
    strict, flexible = StrictChecker(), FlexibleChecker()
    # A gsm8k.yaml target (GSM8K's answer format), read by both rules; the gold may be the bare
    # answer or, as lm-eval's reference, the whole solution ("(?s).*#### " removes the rationale).
    for gold in ("72", NATALIA):
        assert strict.check(NATALIA, None, gold) == flexible.check(NATALIA, None, gold)
        assert strict.check(NATALIA, None, gold).predicted == "72" and strict.check(NATALIA, None, gold).correct
    # REFERENCE.md's examples.
    gen = " 48+24 = 72. The answer is 72."
    assert strict.check(gen, None, "72").predicted is None and not strict.check(gen, None, "72").correct
    assert flexible.check(gen, None, "72").predicted == "72." and flexible.check(gen, None, "72").correct
    v = flexible.check("$1,072.00.", None, "1072")
    assert v.predicted == "$1,072.00." and not v.correct
    assert flexible.check("$1,072.", None, "1072").correct  # "," "$" then the final "." go


def test_what_each_filter_keeps():
    """RegexFilter: strict takes the first "#### n", flexible the last number (of two groups,
    the non-empty one); the metric ignores case, thousands separators, "$" and one final period."""
    strict, flexible = StrictChecker(), FlexibleChecker()
    gen = "#### 5\nthen 7 more, so\n#### 12"
    assert strict.check(gen, None, "5").correct and not strict.check(gen, None, "12").correct
    assert flexible.check(gen, None, "12").correct and flexible.check(gen, None, "12").predicted == "12"
    assert flexible.check("7 apples", None, "7").predicted == "7"  # one digit: the second group
    assert flexible.check("It costs $18", None, "18").predicted == "$18"
    assert strict.check("#### -3", None, "-3").correct and flexible.check("so -3", None, "-3").correct
    assert strict.check("#### 1,080", None, "1080").correct and strict.check("#### 1080", None, "1,080").correct
    assert not strict.check("#### 18.00", None, "18").correct  # no numeric normalisation
    assert not flexible.check("no number here", None, "18").correct
    assert exact_match("Seventy", "seventy") and not exact_match("7.", "7..")


def test_cot_strict_quirk():
    """gsm8k_cot's strict pattern ends in an unescaped "." (any character but a newline): "The
    answer is 29" with nothing after it on its line backtracks to "2" (then "9" is the
    any-character) and is wrong, as in lm-eval; "The answer is 29." and "... 29 " are right."""
    cot = StrictChecker(variant="gsm8k_cot")
    for gen in ("The answer is 29", "The answer is 29\nQ:"):
        assert cot.check(gen, None, "29").predicted == "2" and not cot.check(gen, None, "29").correct
    assert cot.check("The answer is 29.", None, "29").correct and cot.check("The answer is 29 ", None, "29").correct


def test_registered_with_options_checked():
    reg = Registry(autoload=False)
    assert reg.add(plugin).error is None
    assert {"gsm8k_strict", "gsm8k_flexible"} <= set(reg.names("checker"))
    cot = reg.create("checker", "gsm8k_strict", {"variant": "gsm8k_cot"}, "evaluation.checkers[0]")
    assert cot.check("The answer is 4.", None, "4").correct
    with pytest.raises(UserError, match=r"^evaluation.checkers\[0\]\.variant: must be one of gsm8k, gsm8k_cot, "
                                        r"got 'cot'$"):
        reg.create("checker", "gsm8k_strict", {"variant": "cot"}, "evaluation.checkers[0]")
    with pytest.raises(UserError, match=r"unknown option .*accepted: \(none\)"):
        reg.create("checker", "gsm8k_flexible", {"group_select": 0}, "task.checker")
    with pytest.raises(PluginError, match=r"unknown checker 'gsm8k_strcit'.*did you mean 'gsm8k_strict'"):
        reg.create("checker", "gsm8k_strcit", {}, "evaluation.checkers[1]")


@pytest.mark.real_data
@pytest.mark.skipif(not REAL.is_dir(), reason="shared/data is absent")
def test_real_gold_solutions():
    """Every gold solution of the real GSM8K test split, as a generation, is right under both
    rules against the task's gold answer (and against lm-eval's reference, the whole solution)."""
    task, strict, flexible = GSM8KTask(), StrictChecker(), FlexibleChecker()
    examples = task.load("test", str(REAL / "test.jsonl"))
    rows = [json.loads(line) for line in (REAL / "test.jsonl").read_text().splitlines() if line.strip()]
    assert len(examples) == len(rows) == 1319
    for ex, raw in zip(examples, rows):
        solution = ex.fields["solution"]
        assert solution == raw["answer"]
        for checker in (strict, flexible):
            assert checker.check(solution, None, ex.answer).correct, (ex.id, checker)
            assert checker.check(solution, None, raw["answer"]).correct, (ex.id, checker)
        assert re.fullmatch(r"-?[\d,]+", strict.check(solution, None, ex.answer).predicted)
