"""Realistic generations through the full path: the task's loader gives the gold
answer, the task's ``extract`` reads the generation, and the task's default
checker (``mc_letter`` for CQA, ``numeric`` for GSM8K) from this plugin judges it.

The tasks come from the ``star_cqa`` and ``star_gsm8k`` plugins, created through
their ``register_tasks`` hooks; the tests are skipped where those are not installed.
"""

from __future__ import annotations

import json

import pluggy
import pytest

from star_engine import hooks
from star_engine.api import Verdict
from star_filters.plugin import CHECKERS


def make_task(module_name: str, task_name: str):
    module = pytest.importorskip(module_name)
    pm = pluggy.PluginManager("star_engine")
    pm.add_hookspecs(hooks)
    pm.register(module, name=task_name)
    tasks = {}
    pm.hook.register_tasks(register=lambda name, factory: tasks.setdefault(name, factory))
    return tasks[task_name]()


def judge(task, example, generation):
    checker = CHECKERS[task.default_checker]()
    return checker.check(generation, task.extract(generation), example.answer)


# ----------------------------------------------------------------------------- CommonsenseQA

CQA_ROWS = [
    {"answerKey": "E", "id": "ink", "question": {
        "question_concept": "ink", "stem": "What do people use to absorb extra ink from a fountain pen?",
        "choices": [{"label": "A", "text": "shirt pocket"}, {"label": "B", "text": "calligrapher's hand"},
                    {"label": "C", "text": "inkwell"}, {"label": "D", "text": "desk drawer"},
                    {"label": "E", "text": "blotter"}]}},
    {"answerKey": "A", "id": "door", "question": {
        "question_concept": "revolving door",
        "stem": "A revolving door is convenient for two direction travel, but it also serves as a "
                "security measure at a what?",
        "choices": [{"label": "A", "text": "bank"}, {"label": "B", "text": "library"},
                    {"label": "C", "text": "department store"}, {"label": "D", "text": "mall"},
                    {"label": "E", "text": "new york"}]}},
]

INK = " The answer must be used to absorb extra ink. Blotters are designed to absorb liquids."

CQA_CASES = [
    # (id, question, generation, predicted, correct)
    ("right", "ink", INK + " Therefore, the answer is blotter (e).", "e", True),
    ("wrong", "ink", INK + " Therefore, the answer is inkwell (c).", "c", False),
    ("upper_case_letter", "ink", INK + " Therefore, the answer is blotter (E).", "e", True),
    ("all_upper_case", "ink", " BLOTTERS ABSORB INK. THEREFORE, THE ANSWER IS BLOTTER (E).", "e", True),
    ("padded_letter", "ink", INK + " Therefore, the answer is blotter ( e ).", "e", True),
    ("extra_text_after_on_line", "ink",
     INK + " Therefore, the answer is blotter (e). Blotters are cheap too.", "e", True),
    ("runs_on_into_next_question", "ink",
     INK + " Therefore, the answer is blotter (e).\n\nQ: What home entertainment equipment "
     "requires cable?\nAnswer Choices:\n(a) radio shack\n(b) substation\n(c) television", "e", True),
    ("stated_twice_same_line_last_wins", "ink",
     " It could be inkwell (c). But blotters absorb liquids, so the answer is blotter (e).", "e", True),
    ("stated_twice_same_line_last_wrong", "ink",
     " Between blotter (e) and inkwell (c), the answer is inkwell (c).", "c", False),
    ("stated_twice_first_line_wins", "ink",
     INK + " Therefore, the answer is blotter (e).\nTherefore, the answer is inkwell (c).", "e", True),
    ("leading_blank_line", "ink", "\n" + INK + " Therefore, the answer is blotter (e).", "e", True),
    ("answer_on_second_line", "ink",
     INK + "\nTherefore, the answer is blotter (e).", "e", True),
    ("first_line_parenthetical_then_answer", "ink",
     " Blotters absorb ink (see the prompt above).\nSo the answer is blotter (e).", "e", True),
    ("no_parenthesis", "ink", INK + " Therefore, the answer is blotter.", None, False),
    ("bare_letter_no_parenthesis", "ink", INK + " The answer is E.", None, False),
    ("square_brackets", "ink", INK + " Therefore, the answer is blotter [e].", None, False),
    ("letter_outside_choices", "ink", INK + " Therefore, the answer is a pen (f).", "f", False),
    ("letter_first_in_line", "ink", " (E) blotter, because blotters absorb liquids.", "e", True),
    ("direct_answer_only", "ink", " (e)", "e", True),
    ("empty_generation", "ink", "", None, False),
    ("blank_generation", "ink", "\n\n", None, False),
    ("truncated_at_max_tokens", "ink",
     " The answer must be used to absorb extra ink. Blotters are designed to absorb liquids, so the",
     None, False),
    ("wrong_choice_mentioned_mid_sentence", "ink",
     " Option (a) is a pocket, which cannot absorb ink, so it is a blotter.", "a", False),
    ("hinted_leak_still_judged", "ink",
     " Blotter is marked (CORRECT), so the answer is blotter (e).", "e", True),
    ("other_question_right", "door",
     " The answer must be a place where security is important. Banks need security. "
     "Therefore, the answer is bank (a).", "a", True),
    ("other_question_upper_wrong", "door",
     " Malls have many doors. Therefore, the answer is mall (D).", "d", False),
]


@pytest.fixture(scope="module")
def cqa(tmp_path_factory):
    task = make_task("star_cqa.plugin", "cqa")
    path = tmp_path_factory.mktemp("cqa") / "dev.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in CQA_ROWS))
    return task, {e.id: e for e in task.load("dev", str(path))}


def test_cqa_default_checker_is_mc_letter(cqa):
    task, _ = cqa
    assert task.default_checker == "mc_letter"


@pytest.mark.parametrize("question, generation, predicted, correct",
                         [c[1:] for c in CQA_CASES], ids=[c[0] for c in CQA_CASES])
def test_cqa_generation(cqa, question, generation, predicted, correct):
    task, examples = cqa
    assert judge(task, examples[question], generation) == Verdict(predicted, correct)


def test_cqa_enough_cases():
    assert len(CQA_CASES) >= 20 and {c[-1] for c in CQA_CASES} == {True, False}


# ----------------------------------------------------------------------------- GSM8K

GSM8K_GOLDS = ["72", "18", "1,000", "-5", "10", "1,080", "0.5", "50", "72,000"]

CLIPS = (" Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
         "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n")
WAGE = " She works 8 hours a day for $18 per hour so she makes 8*18 = $144.00 per shift.\n"

GSM8K_CASES = [
    # (id, gold, generation, predicted, correct)
    ("right", "72", CLIPS + "#### 72", "72", True),
    ("wrong", "72", CLIPS.replace("72", "70") + "#### 70", "70", False),
    ("no_calculator_marks", "72", " 48/2 = 24 in May. 48 + 24 = 72 in all.\n#### 72", "72", True),
    ("thousands_separator", "1,000", " 10 boxes of 100 make 10*100 = 1,000 pens.\n#### 1,000",
     "1000", True),
    ("thousands_separator_gold_plain", "1,080", " 12 * 90 = 1080 minutes.\n#### 1080", "1080", True),
    ("big_thousands", "72,000", " 6000 * 12 = 72000 dollars a year.\n#### 72,000", "72000", True),
    ("currency", "18", WAGE + "#### $18", "18", True),
    ("trailing_zero_decimals", "18", WAGE + "#### 18.00", "18", True),
    ("trailing_period", "18", WAGE + "#### 18.", "18", True),
    ("unit_word_after", "18", WAGE + "#### 18 dollars", "18", True),
    ("unit_word_after_wrong", "18", WAGE + "#### 144 dollars", "144", False),
    ("negative", "-5", " The temperature fell from 3 to 3 - 8 = -5 degrees.\n#### -5", "-5", True),
    ("negative_currency", "-5", " She is 5 dollars short, so she has -$5.\n#### -$5", "-5", True),
    ("sign_missing", "-5", " The temperature fell from 3 to 3 - 8 = -5 degrees.\n#### 5", "5", False),
    ("hedged_two_numbers", "18", WAGE + "#### 18 or 20", "18 or 20", False),
    ("two_answer_lines_first_wins", "18", WAGE + "#### 18\n#### 144", "18", True),
    ("two_answer_lines_first_wrong", "18", WAGE + "#### 144\n#### 18", "144", False),
    ("no_answer_line", "10", " Weng earns 12/60 = $0.2 per minute, so she earned 0.2 x 50 = $10.",
     None, False),
    ("empty_answer_line", "10", " Weng earns 0.2 x 50 = $10.\n####", None, False),
    ("answer_in_words", "10", " Weng earns 0.2 x 50 = $10.\n#### ten", "ten", False),
    ("no_space_after_marker", "10", " Weng earns 0.2 x 50 = $10.\n####10", "10", True),
    ("marker_mid_line", "72", " So she sold 48 + 24 = 72 clips. #### 72", "72", True),
    ("runs_on_into_next_question", "72",
     CLIPS + "#### 72\nQ: Weng earns $12 an hour for babysitting.\nA: #### 12", "72", True),
    ("fraction_for_decimal_gold", "0.5", " Half of one pie is 1/2 of a pie.\n#### 1/2", "0.5", True),
    ("whole_fraction", "18", " 36 apples shared by 2 is 36/2.\n#### 36/2", "18", True),
    ("percent_sign", "50", " 10 of 20 is 10/20 * 100 = 50 percent.\n#### 50%", "50", True),
    ("decimal_off", "1,080", " 1080.5 minutes in total.\n#### 1080.5", "1080.5", False),
    ("broken_thousands_group", "1,000", " 10 * 100 = 1000 pens.\n#### 1,0000", "1,0000", False),
    ("explicit_plus", "72", CLIPS + "#### +72", "72", True),
]


@pytest.fixture(scope="module")
def gsm8k(tmp_path_factory):
    task = make_task("star_gsm8k.plugin", "gsm8k")
    path = tmp_path_factory.mktemp("gsm8k") / "test.jsonl"
    rows = [{"question": f"Question {i}?", "answer": f"Step one.\n#### {gold}"}
            for i, gold in enumerate(GSM8K_GOLDS)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    examples = task.load("test", str(path))
    assert len(examples) == len(GSM8K_GOLDS)
    return task, dict(zip(GSM8K_GOLDS, examples))


def test_gsm8k_default_checker_is_numeric(gsm8k):
    task, _ = gsm8k
    assert task.default_checker == "numeric"


@pytest.mark.parametrize("gold, generation, predicted, correct",
                         [c[1:] for c in GSM8K_CASES], ids=[c[0] for c in GSM8K_CASES])
def test_gsm8k_generation(gsm8k, gold, generation, predicted, correct):
    task, examples = gsm8k
    assert judge(task, examples[gold], generation) == Verdict(predicted, correct)


def test_gsm8k_enough_cases():
    assert len(GSM8K_CASES) >= 20 and {c[-1] for c in GSM8K_CASES} == {True, False}
