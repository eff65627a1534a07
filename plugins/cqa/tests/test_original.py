"""The cqa task as the released STaR code runs it: original extraction and stored
completion, verbatim prompt files and data, the hinted direct prompt, and the
original prompt files themselves (../shared/data/star-prompts, when present)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from star_testkit import STAR_PROMPTS

from star_cqa import plugin
from star_cqa.answers import first_line, original_letter
from star_cqa.task import CQATask, _split_answer
from star_engine import Registry, UserError
from star_filters.checkers import LowerExactChecker, MCLetterChecker

HERE = Path(__file__).parent
TRAIN = HERE / "data" / "train_sample.jsonl"
PROMPTS = STAR_PROMPTS / "commonsenseqa"
# Every file of the original's commonsenseqa prompt folder, as the option that reads it.
FILES = {"prompts.txt": "prompts_file", "prompts_answer_key.txt": "hint_prompts_file",
         "prompts_direct.txt": "direct_prompts_file", "prompts_direct_answer_key.txt": "direct_hint_prompts_file"}
KIND = {"prompts_file": "rationale", "hint_prompts_file": "hint", "direct_prompts_file": "direct",
        "direct_hint_prompts_file": "direct_hint"}
real = pytest.mark.skipif(not PROMPTS.is_dir(), reason="shared/data/star-prompts is absent")
# Files in the same format, written for this project (3 of the built-in questions).
FIXTURE = HERE / "data" / "star_format"
FOLDERS = [pytest.param(FIXTURE, id="fixture"),
           pytest.param(PROMPTS, id="original", marks=[pytest.mark.real_data, real])]


def strict(task: CQATask, generation: str, gold: str):
    """The original's verdict: trim, extract, compare lower-cased."""
    kept = task.trim(generation)
    return LowerExactChecker().check(kept, task.extract(kept), gold)


ORIGINAL = CQATask(extraction="original", stored_completion="original", verbatim=True)


@pytest.mark.parametrize("generation, letter", [
    (" Blotters absorb liquids. Therefore, the answer is blotter (e).", "e"),
    (" Therefore, the answer is blotter (E).", "E"),          # as it stands; compared lower-cased
    (" ... (c).\nQ: next (a).", "c"),                         # the first line only
    (" ... (b).<|endoftext|>junk (a).", "b"),                  # cut at end-of-text
    ("\n Rivers flow. So the answer is river (c).", None),     # empty first line: wrong, no fallback
    (" The answer is (d)", "("),                               # no final ".": [-3] is "(", wrong
    (" The answer is d.", " "),                                # no parentheses: [-3] is a space
    (" (a) or (b)? Neither; the answer is (c).", "c"),
    ("ab", None),                                              # shorter than 3 characters
    ("", None),
])
def test_original_letter(generation, letter):
    assert original_letter(generation) == letter == ORIGINAL.extract(generation)


def test_original_verdicts_and_the_lenient_ones_differ():
    lenient = CQATask()
    cases = [  # generation, gold, strict verdict, lenient verdict (mc_letter)
        (" Therefore, the answer is blotter (E).", "e", True, True),
        ("\n Therefore, the answer is blotter (e).", "e", False, True),
        (" The answer is blotter (e)", "e", False, True),
        (" I think so.\nTherefore, the answer is blotter (e).", "e", False, True),
        (" Therefore, the answer is blotter (e).", "a", False, False),
    ]
    for generation, gold, want_strict, want_lenient in cases:
        assert strict(ORIGINAL, generation, gold).correct is want_strict, generation
        got = MCLetterChecker().check(generation, lenient.extract(generation), gold)
        assert got.correct is want_lenient, generation


def test_stored_completion():
    text = " People sleep at night. Therefore, the answer is bed (a).\nQ: What next?<|endoftext|>"
    assert ORIGINAL.trim(text) == first_line(text) == " People sleep at night. Therefore, the answer is bed (a)."
    assert ORIGINAL.trim(" a (b).<|endoftext|>more") == " a (b)."
    assert ORIGINAL.trim("\nsecond line") == ""
    assert CQATask().trim(text) == text  # until_stop: the backend already cut it


def test_options_are_checked():
    registry = Registry(autoload=False)
    registry.add(plugin)
    for options, message in [
            ({"extraction": "strict"}, "task.options.extraction: must be one of lenient, original, got 'strict'"),
            ({"stored_completion": "first"}, "task.options.stored_completion: must be one of"),
            ({"verbatim": "yes"}, "task.options.verbatim: expected true or false, got string 'yes'"),
            ({"stop": "\n"}, "task.options.stop: expected a list of strings, got string '\\n'"),
            ({"stop": ["\n", ""]}, "task.options.stop: must be a list of non-empty strings"),
            ({"direct_hint_prompts_file": 3},
             "task.options.direct_hint_prompts_file: expected a string, got integer 3")]:
        with pytest.raises(UserError, match="^" + re.escape(message)):
            registry.create("task", "cqa", options, "task.dataset", "task.options")
    assert CQATask(stop=["\n"]).stop == ("\n",) and CQATask(stop=[]).stop == ()
    assert CQATask().stop == ("\n\n", "\nQ:")


def test_verbatim_prompt_file_is_the_file_text(tmp_path):
    example = "Q: What keeps you dry?\nAnswer Choices:\n(a) towel\n(b) raincoat\nA: Therefore, the answer is raincoat (b)."
    path = tmp_path / "p.txt"
    path.write_text(f"{example}  \n\n{example}\n")  # trailing blanks and a final newline, kept as they are
    assert CQATask(prompts_file=str(path), verbatim=True).prompt("rationale") == path.read_text() + "\n\n"
    assert CQATask(prompts_file=str(path)).prompt("rationale") == f"{example}\n\n{example}\n\n"  # tidied
    three = tmp_path / "three.txt"
    three.write_text(f"{example}\n\n\n{example}")  # the original splits this into "...", "\nQ: ..."
    CQATask(prompts_file=str(three))
    with pytest.raises(UserError, match=re.escape(f"{three}:7: a rationale prompt example must start with 'Q:'")):
        CQATask(prompts_file=str(three), verbatim=True)
    crlf = tmp_path / "crlf.txt"
    crlf.write_bytes(example.replace("\n", "\r\n").encode())
    assert CQATask(prompts_file=str(crlf), verbatim=True).prompt("rationale") == crlf.read_bytes().decode() + "\n\n"


def test_verbatim_data_keeps_stems_and_choices(tmp_path):
    row = {"answerKey": "B", "id": "v1", "question": {"stem": " Where is ice cream?  ", "choices": [
        {"label": "A", "text": "ice cream "}, {"label": "B", "text": "freezer"}]}}
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(row) + "\n")
    ex = CQATask(verbatim=True).load("train", str(path))[0]
    assert CQATask().context(ex) == "Q:  Where is ice cream?  \nAnswer Choices:\n(a) ice cream \n(b) freezer\nA:"
    tidy = CQATask().load("train", str(path))[0]
    assert CQATask().context(tidy) == "Q: Where is ice cream?\nAnswer Choices:\n(a) ice cream\n(b) freezer\nA:"


def test_direct_hint_prompt(tmp_path):
    derived = CQATask().prompt("direct_hint")[:-2].split("\n\n")
    assert len(derived) == 7 and all(b.count(" (CORRECT)") == 1 for b in derived)
    assert [b.replace(" (CORRECT)", "") for b in derived] == CQATask().prompt("direct")[:-2].split("\n\n")
    own = tmp_path / "dh.txt"
    own.write_text("Q: X?\nAnswer Choices:\n(a) y (CORRECT)\n(b) z\nA: (a).")
    assert CQATask(direct_hint_prompts_file=str(own)).prompt("direct_hint") == own.read_text() + "\n\n"
    direct = tmp_path / "d.txt"
    direct.write_text("Q: X?\nAnswer Choices:\n(a) y\n(b) z\nA: (b).")
    assert CQATask(direct_prompts_file=str(direct)).prompt("direct_hint") == (
        "Q: X?\nAnswer Choices:\n(a) y\n(b) z (CORRECT)\nA: (b).\n\n")


# ------------------------------------------------------------------ the original prompt files


def gold_letters(folder: Path) -> list[str]:
    """The gold letters of the prompt examples, from the answer-key file's " (CORRECT)" marks
    (a source independent of the answers themselves)."""
    out = []
    for block in (folder / "prompts_answer_key.txt").read_text().split("\n\n"):
        marked = [line for line in block.split("\n") if line.endswith(" (CORRECT)")]
        assert len(marked) == 1, block
        out.append(marked[0][1])
    return out


@pytest.mark.parametrize("folder", FOLDERS)
def test_every_prompt_file_loads_verbatim(folder):
    assert {p.name for p in folder.iterdir()} == set(FILES), f"a file in {folder} no option reads"
    for name, option in FILES.items():
        path = folder / name
        task = CQATask(**{option: str(path)}, verbatim=True)
        assert task.prompt(KIND[option]) == path.read_text() + "\n\n"  # the original's join, byte for byte
        tidy = CQATask(**{option: str(path)})
        assert tidy.prompt(KIND[option]) == task.prompt(KIND[option])  # these files need no tidying
    assert len(gold_letters(folder)) == (7 if folder == PROMPTS else 3)


@pytest.mark.parametrize("folder", FOLDERS)
@pytest.mark.parametrize("name", sorted(FILES))
def test_prompt_answers_pass_their_own_strict_check(folder, name):
    lenient = CQATask()
    golds = gold_letters(folder)
    blocks = (folder / name).read_text().split("\n\n")
    assert len(blocks) == len(golds)
    for block, gold in zip(blocks, golds):
        answer = _split_answer(block)[1]
        assert strict(ORIGINAL, answer, gold).correct, (name, answer)
        assert MCLetterChecker().check(answer, lenient.extract(answer), gold).correct, (name, answer)
        assert not strict(ORIGINAL, answer, "abcde".replace(gold, "")[0]).correct


@pytest.mark.real_data
@pytest.mark.skipif(not (STAR_PROMPTS.parent / "commonsenseqa").is_dir(), reason="shared/data is absent")
def test_real_data_verbatim_and_strict_gold():
    data = STAR_PROMPTS.parent / "commonsenseqa" / "train_rand_split.jsonl"
    rows = {r["id"]: r for r in map(json.loads, data.read_text().splitlines())}
    exs = ORIGINAL.load("train", str(data))
    texts = {c["text"] for e in exs for c in e.fields["choices"]}
    assert "ice cream " in texts  # one choice text ends in a space; the original keeps it
    for e in exs:
        r = rows[e.id]
        assert e.question == r["question"]["stem"]
        assert strict(ORIGINAL, ORIGINAL.gold_completion(e, direct=True), r["answerKey"]).correct


@pytest.mark.parametrize("generation, kept, letter", [
    (" So the answer is blotter (e) .", " So the answer is blotter (e).", "e"),   # " ." -> "."
    (" It is n't here , so (b) .\nQ: x (a) .", " It isn't here, so (b).", "b"),   # first line, cleaned
    (" The dog 's bowl (c) !", " The dog's bowl (c)!", "c"),
    (" They 're out ; (d)  .", " They're out ; (d) .", ")"),  # one space goes: "  ." -> " ."
])
def test_original_decodes_with_gpt2_clean_up(generation, kept, letter):
    """The released code decoded with GPT-2's clean_up_tokenization_spaces=True: " ." is
    "." before the [-3] extraction and storage, so "(e) ." gives "e" (not ")")."""
    assert ORIGINAL.trim(generation) == kept
    assert ORIGINAL.extract(ORIGINAL.trim(generation)) == letter
    assert CQATask().trim(generation) == generation  # lenient extraction: the text as decoded
    assert strict(ORIGINAL, generation, letter).correct


def test_without_the_clean_up_the_original_letter_would_be_the_parenthesis():
    assert original_letter(" the answer is (e) .") == ")"  # what the engine read before decoding as GPT-2 did
    assert ORIGINAL.extract(ORIGINAL.trim(" the answer is (e) .")) == "e"
