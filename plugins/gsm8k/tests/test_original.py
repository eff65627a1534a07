"""The gsm8k task as the released STaR code runs it: the raw gold answer, original
extraction and stored completion, verbatim prompts and questions, the hint template
(the released code's whole-solution hint), and the original prompt files
(../shared/data/star-prompts, when present)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from star_testkit import STAR_PROMPTS

from star_engine import Example, Registry, UserError
from star_filters.checkers import LowerExactChecker, NumericChecker
from star_gsm8k import plugin
from star_gsm8k.answers import answer_lines, original_answer
from star_gsm8k.task import AnswerHint, GSM8KTask

HERE = Path(__file__).parent
TRAIN = HERE / "data" / "train_sample.jsonl"
PROMPTS = STAR_PROMPTS / "gsm"
real = pytest.mark.skipif(not PROMPTS.is_dir(), reason="shared/data/star-prompts is absent")
# Files in the same format, written for this project (3 of the built-in problems).
FIXTURE = HERE / "data" / "star_format"
FOLDERS = [pytest.param(FIXTURE, id="fixture"),
           pytest.param(PROMPTS, id="original", marks=[pytest.mark.real_data, real])]


def create(kind, name, options, key):
    """The component built as the core builds it: its declared options checked by the registry first."""
    registry = Registry(autoload=False)
    registry.add(plugin)
    return registry.create(kind, name, options, key)


ORIGINAL = GSM8KTask(gold_answer="raw", extraction="original", stored_completion="original", verbatim=True)


def strict(task: GSM8KTask, generation: str, gold: str):
    kept = task.trim(generation)
    return LowerExactChecker().check(kept, task.extract(kept), gold)


@pytest.mark.parametrize("generation, answer", [
    (" 3 * 4 = 12.\n#### 12", "12"),
    (" In 30 days it makes $1,350.\n#### 1,350\n\nQ: next\nA: #### 7", "1,350"),  # first #### line, as written
    (" So #### 5 #### 6", "6"),                   # the text after the line's last ####
    (" It is 4.\n####  4 apples ", "4 apples"),    # stripped, not normalised
    (" It is 4.\n#### $4.00", "$4.00"),
    (" It is 4.<|endoftext|>Q: x\n#### 9", "It is 4."),  # cut at end-of-text first, as the original
    (" The answer is 12.", None),                  # no #### line
    ("", None),
])
def test_original_answer(generation, answer):
    assert original_answer(generation) == answer == ORIGINAL.extract(generation)


def test_strict_compares_strings_lower_cased():
    assert strict(ORIGINAL, " ...\n#### 1,350", "1,350").correct
    assert not strict(ORIGINAL, " ...\n#### 1350", "1,350").correct      # no numeric normalisation
    assert not strict(ORIGINAL, " ...\n#### $1,350", "1,350").correct
    assert strict(ORIGINAL, " ...\n#### Twelve", "twelve").correct        # case
    assert not strict(ORIGINAL, " 12 apples", "12").correct               # no #### line
    lenient = GSM8KTask()
    for gold in ("1,350", "1350"):  # the lenient numeric path works with the raw or the normalised gold
        for text in (" ...\n#### 1350", " ...\n#### $1,350.00"):
            assert NumericChecker().check(text, lenient.extract(text), gold).correct, (text, gold)


def test_stored_completion():
    text = " 5 * 8 = 40 chairs.\n40 - 27 = 13.\n#### 13\n\nQ: A shop has 4 bags.\nA: #### 4"
    assert ORIGINAL.trim(text) == answer_lines(text) == " 5 * 8 = 40 chairs.\n40 - 27 = 13.\n#### 13"
    assert ORIGINAL.trim(" 13\n#### 13<|endoftext|>Q:") == " 13\n#### 13"
    assert ORIGINAL.trim(" no answer\nat all") == " no answer\nat all"
    assert GSM8KTask().trim(text) == text


def test_original_decodes_with_gpt2_clean_up():
    """The released code decoded with GPT-2's clean_up_tokenization_spaces=True before the
    "####" split and storage: " ," and " ." lose their space."""
    text = " Tom has 5 apples , then 3 more .\n5 + 3 = 8 .\n#### 8 .\n\nQ: next"
    assert ORIGINAL.trim(text) == " Tom has 5 apples, then 3 more.\n5 + 3 = 8.\n#### 8."
    assert ORIGINAL.extract(ORIGINAL.trim(text)) == "8."
    assert ORIGINAL.extract(answer_lines(text)) == "8 ."  # what the engine read before
    assert GSM8KTask().trim(text) == text


def test_raw_gold_answer_keeps_commas():
    raw = GSM8KTask(gold_answer="raw").load("train", str(TRAIN))
    assert [e.answer for e in raw] == ["32", "1,350", "-6"]
    assert [e.answer for e in GSM8KTask().load("train", str(TRAIN))] == ["32", "1350", "-6"]
    assert GSM8KTask(gold_answer="raw").gold_completion(raw[1], direct=True) == " #### 1,350"
    assert raw[1].fields["solution"] == json.loads(TRAIN.read_text().splitlines()[1])["answer"]


def test_raw_gold_answer_must_be_the_final_answer(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"question": "q?", "answer": "It is 5.\n####5"}) + "\n")
    GSM8KTask().load("train", str(path))  # the normalised reading finds 5
    with pytest.raises(UserError, match=re.escape(f"{path}:1: field 'answer': the text after its last '#### '")):
        GSM8KTask(gold_answer="raw").load("train", str(path))
    with pytest.raises(UserError, match="^task.options.gold_answer: must be one of normalized, raw, got 'as-is'$"):
        create("task", "gsm8k", {"gold_answer": "as-is"}, "task.options")


def test_verbatim_keeps_questions():
    ex = GSM8KTask(verbatim=True).load("train", str(TRAIN))[1]
    assert GSM8KTask().context(ex) == "Q: A farm sells 90 eggs a day for $0.5 each.\nHow much money does it make in 30 days?\nA:"


def test_hint_templates():
    task = GSM8KTask(gold_answer="raw")
    ex = task.load("train", str(TRAIN))[1]
    solution = json.loads(TRAIN.read_text().splitlines()[1])["answer"]
    released = AnswerHint(template="({solution})")
    assert released.context(task, ex) == f"Q: {ex.question} ({solution})\nA:"  # the released code's hint
    assert released.leak_strings(task, ex) == (f"({solution})",)
    assert AnswerHint(template="({answer})").context(task, ex).endswith("days? (1,350)\nA:")  # the hint file's form
    assert AnswerHint().context(task, ex).endswith("days? (Answer: 1,350)\nA:")
    assert AnswerHint(template="{{{answer}}}").text(ex) == "{1,350}"
    for template, message in [("(Answer: {number})", "unknown placeholder {number}"),
                              ("({answer:>5})", "unknown placeholder {answer:>5}"),
                              ("({})", "unknown placeholder {}"), ("(answer}", "template: Single '}'"),
                              ("", "task.hint.template: must not be empty")]:
        with pytest.raises(UserError, match=re.escape(message)):
            create("hint", "gsm8k_answer", {"template": template}, "task.hint")
    with pytest.raises(UserError, match="has no solution text"):
        released.text(Example("x", "q", "5"))


def test_direct_hint_prompt(tmp_path):
    derived = GSM8KTask().prompt("direct_hint")[:-2].split("\n\n")
    assert len(derived) == 7 and all(re.search(r" \(Answer: -?\d+\)\nA: #### ", b) for b in derived)
    own = tmp_path / "dh.txt"
    own.write_text("Q: What is 1 + 1? (2)\nA: #### 2")
    assert GSM8KTask(direct_hint_prompts_file=str(own)).prompt("direct_hint") == own.read_text() + "\n\n"


def test_options_are_checked():
    for options, message in [({"extraction": "strict"}, "task.options.extraction: must be one of lenient, original"),
                             ({"stored_completion": "all"}, "task.options.stored_completion: must be one of"),
                             ({"stop": ["\nQ:", 3]},
                              "task.options.stop: expected a list of strings, got array ['\\nQ:', 3]"),
                             ({"stop": ["\nQ:", ""]}, "task.options.stop: must be a list of non-empty strings"),
                             ({"verbatim": 1}, "task.options.verbatim: expected true or false, got integer 1")]:
        with pytest.raises(UserError, match="^" + re.escape(message)):
            create("task", "gsm8k", options, "task.options")
    assert GSM8KTask(stop=[]).stop == () and GSM8KTask().stop == ("\nQ:", "\n\n\n")


# ------------------------------------------------------------------ the original prompt files


def hinted_answers(folder: Path) -> list[str]:
    """The gold answers of the prompt examples, from the "(72)" after each question of the
    answer-key file (a source independent of the "#### 72" lines)."""
    out = []
    for block in (folder / "prompts_answer_key.txt").read_text().split("\n\n"):
        m = re.search(r" \(([^()\n]+)\)\nA:", block)
        assert m, block
        out.append(m.group(1))
    return out


FILES = {"prompts.txt": ("prompts_file", "rationale"), "prompts_answer_key.txt": ("hint_prompts_file", "hint")}


@pytest.mark.parametrize("folder", FOLDERS)
def test_every_prompt_file_goes_through_the_loader(folder):
    for name, (option, kind) in FILES.items():
        path = folder / name
        task = GSM8KTask(**{option: str(path)}, verbatim=True)
        assert task.prompt(kind) == path.read_text() + "\n\n"  # the original's join, byte for byte
    if folder == FIXTURE:
        assert {p.name for p in folder.iterdir()} == set(FILES)
        return
    # The third file is not a GSM8K prompt: CQA questions without their choices, answered in
    # words ("Therefore, the answer is blotter."). The original never reads it (a GSM8K run is
    # never --direct, and --direct would first open gsm/prompts_direct.txt, which does not exist).
    odd = "prompts_direct_answer_key.txt"
    assert {p.name for p in folder.iterdir()} == {*FILES, odd}, "a new file in star-prompts/gsm"
    with pytest.raises(UserError, match=re.escape(f"{folder / odd}:1: the answer of this direct_hint prompt "
                                                  "example has no '#### <number>' line")):
        GSM8KTask(direct_hint_prompts_file=str(folder / odd), verbatim=True)
    assert all(block.startswith("Q: ") and "\nA: Therefore, the answer is " in block
               for block in (folder / odd).read_text().split("\n\n"))


@pytest.mark.parametrize("folder", FOLDERS)
@pytest.mark.parametrize("name", sorted(FILES))
def test_prompt_answers_pass_their_own_strict_check(folder, name):
    golds = hinted_answers(folder)
    blocks = (folder / name).read_text().split("\n\n")
    assert len(blocks) == len(golds) == (6 if folder == PROMPTS else 3)
    lenient = GSM8KTask()
    for block, gold in zip(blocks, golds):
        answer = block.split("\nA:", 1)[1]
        assert strict(ORIGINAL, answer, gold).correct, (name, answer)
        assert NumericChecker().check(answer, lenient.extract(answer), gold).correct
        assert ORIGINAL.trim(answer) == answer  # each example ends with its #### line


@pytest.mark.real_data
@pytest.mark.skipif(not (STAR_PROMPTS.parent / "gsm8k").is_dir(), reason="shared/data is absent")
def test_real_data_raw_golds_and_verbatim_questions():
    data = STAR_PROMPTS.parent / "gsm8k"
    commas = {}
    for split in ("train", "test"):
        rows = [json.loads(line) for line in (data / f"{split}.jsonl").read_text().splitlines()]
        exs = ORIGINAL.load(split, str(data / f"{split}.jsonl"))
        assert [e.answer for e in exs] == [r["answer"].split("#### ")[-1] for r in rows]
        assert [e.question for e in exs] == [r["question"] for r in rows]  # verbatim, \u2028 and all
        commas[split] = sum("," in e.answer for e in exs)
        for e in exs:  # each gold solution passes its own strict check, and the hint carries it whole
            assert strict(ORIGINAL, " " + e.fields["solution"], e.answer).correct, e.id
            assert AnswerHint(template="({solution})").context(ORIGINAL, e) == (
                f"Q: {e.question} ({e.fields['solution']})\nA:")
    assert commas == {"train": 79, "test": 14}
