"""Tests of the addition task: generator, scratchpad arithmetic, formats, hint, options."""

from __future__ import annotations

import random
import re
from collections import Counter
from importlib.metadata import entry_points

import pytest

from star_arithmetic import plugin
from star_arithmetic.task import AdditionTask, TargetHint
from star_engine import Example, Registry, Task, UserError


def cut(generation: str, stop: tuple[str, ...]) -> str:
    """What a backend returns: the generation cut before the first stop string."""
    ends = [generation.find(s) for s in stop if s in generation]
    return generation[: min(ends)] if ends else generation


def digits_of(spaced: str) -> str:
    assert re.fullmatch(r"\d( \d)*", spaced), spaced
    return spaced.replace(" ", "")


def verify_scratchpad(text: str) -> tuple[int, int, int]:
    """Parse a completion back and check every step's arithmetic on its own terms.
    Returns (a, b, result)."""
    lines = text.split("\n")
    assert lines[0] == "<scratch>"
    m = re.fullmatch(r"([\d ]+) \+ ([\d ]+) , C: 0", lines[1])
    assert m, lines[1]
    da, db = digits_of(m[1]), digits_of(m[2])
    carry, partial = 0, ""
    n = max(len(da), len(db))
    for k in range(1, n + 1):
        m = re.fullmatch(r"(?:([\d ]*?) ?\+ ?([\d ]*) )?, ([\d ]+) C: ([01])", lines[1 + k])
        assert m, lines[1 + k]
        assert (m[1] or "").replace(" ", "") == da[: max(len(da) - k, 0)]  # digits still to add
        assert (m[2] or "").replace(" ", "") == db[: max(len(db) - k, 0)]
        total = int(da[-k] if k <= len(da) else 0) + int(db[-k] if k <= len(db) else 0) + carry
        partial = str(total % 10) + partial
        carry = total // 10
        assert digits_of(m[3]) == partial and int(m[4]) == carry
    final = lines[2 + n].split(" ")
    assert final[0] == str(carry) and "".join(final[1:]) == partial
    assert lines[3 + n] == "</scratch>"
    result = int(digits_of(lines[4 + n]))
    assert result == int(str(carry) + partial) == int(da) + int(db)
    assert lines[5 + n:] == ["", ""]  # the blank-line terminator ends the completion
    return int(da), int(db), result


def test_protocols_and_registration():
    task = AdditionTask()
    assert isinstance(task, Task)
    tasks, hints = {}, {}
    plugin.register_tasks(register=lambda name, f: tasks.setdefault(name, f))
    plugin.register_hint_formatters(register=lambda name, f: hints.setdefault(name, f))
    assert tasks == {"addition": AdditionTask} and hints == {"addition_target": TargetHint}
    assert (task.default_checker, task.default_hint, task.stop) == ("exact", "addition_target", ("\n\n",))
    assert "arithmetic" in {ep.name for ep in entry_points(group="star_engine")}


def test_formats_for_29_plus_57():
    task = AdditionTask()
    ex = Example(id="29+57", question="2 9 + 5 7", answer="86", cls="2", fields={"a": 29, "b": 57})
    assert task.context(ex) == "Input:\n2 9 + 5 7\nTarget:\n"
    assert task.gold_completion(ex, direct=False) == (
        "<scratch>\n2 9 + 5 7 , C: 0\n2 + 5 , 6 C: 1\n, 8 6 C: 0\n0 8 6\n</scratch>\n8 6\n\n")
    assert task.gold_completion(ex, direct=True) == "8 6\n\n"
    assert TargetHint().context(task, ex) == "Input:\n2 9 + 5 7\nHint: 8 6\nTarget:\n"


def test_generation_is_deterministic_and_disjoint():
    a, b = AdditionTask(seed=3), AdditionTask(seed=3)
    train, dev = a.load("train", None), a.load("dev", None)
    assert train == b.load("train", None) and dev == b.load("dev", None)
    assert a.seed_examples() == b.seed_examples()
    assert train != AdditionTask(seed=4).load("train", None)
    assert len(train) == 2000 and len(dev) == 250
    assert not {e.id for e in train} & {e.id for e in dev}
    assert len({e.id for e in train}) == len(train)
    # dev does not depend on the train size (changing n_train keeps results comparable)
    assert AdditionTask(seed=3, n_train=50).load("dev", None) == dev
    for e in train + dev:
        x, y = e.fields["a"], e.fields["b"]
        assert e.answer == str(x + y) and e.question == f"{' '.join(str(x))} + {' '.join(str(y))}"
        assert e.cls == str(len(str(x))) == str(len(str(y)))
    # equal shares: 50 of the 100 one-digit problems; train gets the other 50
    assert Counter(e.cls for e in dev) == {"1": 50, "2": 50, "3": 50, "4": 50, "5": 50}
    assert Counter(e.cls for e in train)["1"] == 50


@pytest.mark.parametrize("options, shares", [
    ({}, {"1": 50, "2": 50, "3": 50, "4": 50, "5": 50}),
    ({"n_dev": 300, "min_digits": 2, "max_digits": 4}, {"2": 100, "3": 100, "4": 100}),
    ({"n_dev": 7, "min_digits": 2, "max_digits": 4}, {"2": 2, "3": 2, "4": 3}),  # the larger counts take the rest
    ({"n_dev": 40, "max_digits": 1, "seed_max_digits": 1, "n_train": 50, "n_seed": 30}, {"1": 40}),
    ({"n_dev": 1000, "min_digits": 3, "max_digits": 7, "seed_max_digits": 3}, {str(d): 200 for d in range(3, 8)}),
])
def test_dev_has_equal_shares_of_every_digit_count(options, shares):
    task = AdditionTask(**options)
    dev = task.load("dev", None)
    assert Counter(e.cls for e in dev) == shares
    assert len({e.id for e in dev}) == len(dev)
    assert not {e.id for e in dev} & {e.id for e in task.load("train", None)}
    seed_ids = {f"{a}+{b}" for a, b in task._problems["seed"]}
    assert not {e.id for e in dev} & seed_ids
    assert [e.cls for e in dev[:40]] != sorted(e.cls for e in dev[:40]) or len(shares) == 1  # shuffled


def test_dev_takes_at_most_half_of_a_digit_count():
    # 1-5 digits: an equal share above 50 would take more than half of the 100 one-digit problems
    with pytest.raises(UserError, match=r"n_dev: 255 is too many: .* 51 problems of 1 digits, but at most 50"):
        AdditionTask(n_dev=255).load("dev", None)
    assert len(AdditionTask(n_dev=500, min_digits=2).load("dev", None)) == 500


def test_seed_set():
    task = AdditionTask(n_seed=60, seed_max_digits=2, seed_hint_fraction=0.5)
    seed = task.seed_examples()
    plain, hinted = seed[:60], seed[60:]
    assert len(hinted) == 30
    dev_contexts = {task.context(e) for e in task.load("dev", None)}
    for ex in plain:
        a, b, _ = verify_scratchpad(ex.completion)
        assert ex.prompt == f"Input:\n{' '.join(str(a))} + {' '.join(str(b))}\nTarget:\n"
        assert len(str(a)) <= 2 and ex.prompt not in dev_contexts
    for ex, base in zip(hinted, plain):
        assert ex.completion == base.completion
        assert ex.prompt == base.prompt.replace("Target:\n", f"Hint: {base.completion.split(chr(10))[-3]}\nTarget:\n")
    assert Counter(len(str(verify_scratchpad(e.completion)[0])) for e in plain) == {1: 30, 2: 30}
    assert AdditionTask(n_seed=0).seed_examples() == []


def test_seed_counts_per_digit_count():
    task = AdditionTask(seed_counts=[10, 30, 0, 5], seed_hint_fraction=0.0)
    seed = task._problems["seed"]
    assert task.n_seed == 45 and task.seed_max_digits == 4
    by = {d: sum(1 for a, _ in seed if len(str(a)) == d) for d in range(1, 6)}
    assert by == {1: 10, 2: 30, 3: 0, 4: 5, 5: 0}
    assert not set(seed) & set(task._problems["dev"])
    assert [e.prompt for e in task.seed_examples()] == [e.prompt for e in AdditionTask(
        seed_counts=[10, 30, 0, 5], seed_hint_fraction=0.0).seed_examples()]  # seeded


def test_seed_repeats_multiply_a_digit_counts_examples():
    once = AdditionTask(seed_counts=[10, 30, 5], seed_hint_fraction=0.2).seed_examples()
    more = AdditionTask(seed_counts=[10, 30, 5], seed_hint_fraction=0.2, seed_repeats=[4, 1]).seed_examples()
    digits = lambda e: len(verify_scratchpad(e.completion)[0].__str__())
    count = lambda exs: Counter((digits(e), "Hint:" in e.prompt) for e in exs)
    want = {k: n * (4 if k[0] == 1 else 1) for k, n in count(once).items()}  # 3 digits: past the list, once
    assert count(more) == want and sum(count(once)[1, h] for h in (False, True)) > 10  # some 1-digit seeds hinted
    assert set((e.prompt, e.completion) for e in more) == set((e.prompt, e.completion) for e in once)
    assert AdditionTask(seed_counts=[10, 30, 5], seed_hint_fraction=0.2, seed_repeats=[1]).seed_examples() == once


def test_seed_hint_fraction_per_digit_count():
    task = AdditionTask(seed_counts=[10, 30, 20, 8], seed_hint_fraction=[0.5, 0.1, 1.0])
    digits = lambda e: len(str(verify_scratchpad(e.completion)[0]))
    count = Counter((digits(e), "Hint:" in e.prompt) for e in task.seed_examples())
    # 4 digits: past the list's end, the last share (1.0)
    assert count == {(1, False): 10, (1, True): 5, (2, False): 30, (2, True): 3, (3, False): 20, (3, True): 20,
                     (4, False): 8, (4, True): 8}
    seed = task._problems["seed"]
    hinted = [e.prompt for e in task.seed_examples() if "Hint:" in e.prompt]
    first = [p for d, k in ((1, 5), (2, 3)) for p in [q for q in seed if len(str(q[0])) == d][:k]]
    assert {task.context(Example("x", "", "", "", {"a": a, "b": b})) for a, b in first} <= \
        {h.replace(h[h.index("Hint:"):h.index("Target:")], "") for h in hinted}  # each count's first problems
    # A one-share list is the scalar share, counted per digit count.
    assert len(AdditionTask(seed_counts=[10, 30], seed_hint_fraction=[0.2]).seed_examples()) == 10 + 30 + 2 + 6


def test_scratchpad_arithmetic_on_random_problems():
    task = AdditionTask(seed=11, n_train=400, max_digits=8)
    for e in task.load("train", None):
        assert verify_scratchpad(task.gold_completion(e, direct=False))[2] == int(e.answer)
    rng = random.Random(5)  # the formatter handles unequal lengths too
    from star_arithmetic.formats import rationale_completion
    for _ in range(200):
        a, b = rng.randrange(10 ** rng.randint(1, 7)), rng.randrange(10 ** rng.randint(1, 7))
        assert verify_scratchpad(rationale_completion(a, b))[:2] == (a, b)


def test_sizes_fit_a_512_byte_context():
    task = AdditionTask()
    ex = Example(id="99999+99999", question="9 9 9 9 9 + 9 9 9 9 9", answer="199998", cls="5",
                 fields={"a": 99999, "b": 99999})
    longest = TargetHint().context(task, ex) + task.gold_completion(ex, direct=False)
    assert len(longest.encode()) < 400


@pytest.mark.parametrize("generation, answer", [
    ("<scratch>\n2 9 + 5 7 , C: 0\n2 + 5 , 6 C: 1\n, 8 6 C: 0\n0 8 6\n</scratch>\n8 6", "86"),
    ("<scratch>\n2 9 + 5 7 , C: 0\n, 8 6 C: 0\n</scratch>\n8 7\nInput:\n1 + 1", "87"),  # first line after it
    ("<scratch>\n2 9 + 5 7 , C: 0\n2 + 5 , 6 C: 1\n, 8 6", None),  # cut off inside the scratchpad
    ("<scratch>\n1 + 2 , C: 0\n</scratch>\n", None),
    ("<scratch>\n1 + 2 , C: 0\n</scratch>\n3 x", None),
    ("1 2 0 4", "1204"),  # a direct answer
    ("  \n 9 9 \n", "99"),
    ("", None),
])
def test_extract(generation, answer):
    assert AdditionTask().extract(generation) == answer


def test_gold_round_trip_through_stop_and_extract():
    task = AdditionTask(n_train=100)
    for e in task.load("train", None):
        for direct in (False, True):
            kept = cut(task.gold_completion(e, direct) + "Input:\n1 + 2\nTarget:\n", task.stop)
            assert task.extract(kept) == e.answer
            assert kept + "\n\n" == task.gold_completion(e, direct)


def test_hint_and_leaks():
    task, hint = AdditionTask(), TargetHint()
    for e in task.load("dev", None)[:50]:
        plain, hinted = task.context(e), hint.context(task, e)
        assert "Hint" not in plain  # the stored context stays hint-free
        assert hinted.split("\n")[2] == "Hint: " + " ".join(e.answer)
        assert hinted.replace(hinted.split("\n")[2] + "\n", "") == plain
        assert hint.leak_strings(task, e) == ("Hint: " + " ".join(e.answer), "Hint:")


def test_prompts():
    assert AdditionTask().prompt("rationale") == ""
    task = AdditionTask(n_shots=2)
    seed = task.seed_examples()
    assert task.prompt("rationale") == "".join(s.prompt + s.completion for s in seed[:2])
    hinted = task.prompt("hint")
    assert hinted.count("Hint: ") == 2 and hinted.replace("Hint: ", "") != task.prompt("rationale")
    direct = task.prompt("direct").split("\n\n")
    assert len(direct) == 3 and direct[2] == "" and all("<scratch>" not in d for d in direct)
    with pytest.raises(ValueError):
        task.prompt("cot")


def test_heldout_split():
    task = AdditionTask(heldout_digits=[6, 7], n_heldout=40)
    held = task.load("heldout", None)
    assert Counter(e.cls for e in held) == {"6": 20, "7": 20}
    with pytest.raises(UserError, match="set task.options.heldout_digits"):
        AdditionTask().load("heldout", None)


@pytest.mark.parametrize("options, message", [
    ({"heldout_digits": [3]}, "task.options.heldout_digits: 3 is inside the training range"),
    ({"n_shots": 5, "n_seed": 2}, "task.options.n_shots: .* must be <= n_seed"),
    ({"max_digits": 1, "seed_max_digits": 1, "n_dev": 10, "n_train": 200},
     "task.options.n_train: 200 is too many: only 90 distinct problems"),
    ({"max_digits": 1, "seed_max_digits": 1, "n_dev": 60},
     "task.options.n_dev: 60 is too many: .* at most 50 of its 100"),
    ({"n_dev": 0}, "task.options.n_dev: must be >= 1, got 0"),
    ({"seed": True}, "task.options.seed: expected an integer, got boolean True"),
    ({"max_digits": 0}, "task.options.max_digits: must be >= 1, got 0"),
    ({"max_digits": 1000, "min_digits": 500}, "task.options.max_digits: at most 100 digits, got 1000"),
    ({"max_digits": 5, "heldout_digits": [1000]}, "task.options.heldout_digits: at most 100 digits, got 1000"),
    ({"min_digits": 3, "max_digits": 2}, r"task.options.max_digits: must be >= min_digits \(3\), got 2"),
    ({"seed_max_digits": 6}, r"task.options.seed_max_digits: must be in 1..5 \(min_digits..max_digits\), got 6"),
    ({"seed_max_digits": 2, "min_digits": 3}, r"task.options.seed_max_digits: must be in 3..5"),
    ({"n_heldout": 0, "heldout_digits": [6]}, "task.options.n_heldout: must be >= 1, got 0"),
    ({"seed_hint_fraction": 1.5}, r"task.options.seed_hint_fraction: must be a number in \[0, 1\]"),
    ({"seed_hint_fraction": [0.5, "x"]},
     r"task.options.seed_hint_fraction: expected a number or a list of numbers, got array \[0.5, 'x'\]"),
    ({"seed_hint_fraction": [0.5, 1.5]}, r"task.options.seed_hint_fraction: must be a number in \[0, 1\] or a list"),
    ({"seed_hint_fraction": [0.1] * 6}, r"task.options.seed_hint_fraction: must be a list of 1 to 5 shares"),
    ({"seed_hint_fraction": []}, r"task.options.seed_hint_fraction: must be a list of 1 to 5 shares"),
    ({"heldout_digits": "6"}, "task.options.heldout_digits: expected a list of integers, got string '6'"),
    ({"heldout_digits": [0]}, "task.options.heldout_digits: every count must be >= 1, got 0"),
    ({"seed_counts": [1, 2, 3, 4, 5, 6]}, r"task.options.seed_counts: must be a list of 1 to 5 counts \(digit counts "
                                          r"1..5\)"),
    ({"seed_counts": [1, -2]}, "task.options.seed_counts: every count must be >= 0, got -2"),
    ({"seed_counts": [99, 10], "n_dev": 10}, "task.options.seed_counts: 99 problems of 1 digits is too many"),
    ({"scratchpad": "detailed"}, "task.options.scratchpad: must be one of nye, columns, got 'detailed'"),
    ({"seed_repeats": [1, 1, 1, 1, 1, 1]}, "task.options.seed_repeats: must be a list of 1 to 5 repeat counts"),
    ({"seed_repeats": [0]}, "task.options.seed_repeats: every count must be >= 1, got 0"),
    ({"seed_repeats": 3}, "task.options.seed_repeats: expected a list of integers, got integer 3"),
    ({"seed_repeats": [5000]}, "task.options.seed_repeats: at most 1000 repeats"),
    # An option another makes pointless is an error naming both (not silently ignored).
    ({"seed_counts": [10, 20], "n_seed": 100}, "task.options.n_seed: has no effect when seed_counts is set .* "
                                               "remove n_seed or seed_counts"),
    ({"seed_counts": [10, 20], "seed_max_digits": 2},
     "task.options.seed_max_digits: has no effect when seed_counts is set"),
    ({"n_heldout": 40}, "task.options.n_heldout: has no effect without heldout_digits"),
])
def test_bad_options(options, message):
    # the real path: the registry checks the declared options, builds the task, the core loads it
    registry = Registry(autoload=False)
    registry.add(plugin)
    with pytest.raises(UserError, match="^" + message) as e:
        task = registry.create("task", "addition", options, "task.dataset", "task.options")
        task.load("train", None)
    assert e.value.key.startswith("task.options") and "\n" not in str(e.value)


def test_bad_splits():
    task = AdditionTask()
    with pytest.raises(UserError, match="task.data.train: the addition task generates its data") as e:
        task.load("train", "/tmp/train.jsonl")
    assert e.value.key == "task.data.train"
    with pytest.raises(UserError, match="unknown split 'test'"):
        task.load("test", None)


def test_digit_roles_mark_what_each_scratchpad_digit_computes():
    from star_arithmetic.formats import digit_roles, rationale_completion
    c = rationale_completion(29, 57)
    roles = digit_roles(c)
    assert [(c[i], r) for i, r in roles if r != "copy"] == [
        ("6", "sum"), ("1", "carry"), ("8", "sum"), ("0", "carry"), ("8", "result"), ("6", "result")]
    assert all(c[i].isdigit() for i, _ in roles)
    assert len(roles) == sum(ch.isdigit() for ch in c)
    rng = random.Random(7)
    for _ in range(100):  # one sum and one carry per column, the sum's digits in the result
        a, b = rng.randrange(10 ** rng.randint(1, 6)), rng.randrange(10 ** rng.randint(1, 6))
        c = rationale_completion(a, b)
        roles = digit_roles(c)
        columns = max(len(str(a)), len(str(b)))
        sums = [c[i] for i, r in roles if r == "sum"]
        carries = [c[i] for i, r in roles if r == "carry"]
        assert len(sums) == len(carries) == columns
        assert "".join(reversed(sums)) == str(a + b).zfill(columns)[-columns:]
        assert "".join(c[i] for i, r in roles if r == "result") == str(a + b)


def verify_columns(text: str) -> tuple[int, int, int]:
    """Parse a ``columns`` completion: each step line's column (x + y + c = C S) must be
    the column's digits and the carry in, summed right; removing the column gives the
    paper's line, so the rest is checked by verify_scratchpad."""
    nye_lines, carry = [], 0
    for line in text.split("\n"):
        m = re.fullmatch(r"(.*?, )(\d) \+ (\d) \+ (\d) = (\d) (\d) , (.*)", line)
        if m:
            x, y, c, hi, lo = map(int, m.group(2, 3, 4, 5, 6))
            assert c == carry and x + y + c == 10 * hi + lo, line
            assert m[7].startswith(f"{lo}") and m[7].endswith(f"C: {hi}"), line
            carry = hi
            line = m[1] + m[7]
        nye_lines.append(line)
    return verify_scratchpad("\n".join(nye_lines))


def test_columns_scratchpad():
    task = AdditionTask(scratchpad="columns", n_train=300)
    ex = Example(id="29+57", question="2 9 + 5 7", answer="86", cls="2", fields={"a": 29, "b": 57})
    assert task.gold_completion(ex, direct=False) == (
        "<scratch>\n2 9 + 5 7 , C: 0\n2 + 5 , 9 + 7 + 0 = 1 6 , 6 C: 1\n, 2 + 5 + 1 = 0 8 , 8 6 C: 0\n0 8 6\n"
        "</scratch>\n8 6\n\n")
    assert task.gold_completion(ex, direct=True) == "8 6\n\n"
    for e in task.load("train", None):
        assert verify_columns(task.gold_completion(e, direct=False))[2] == int(e.answer)
        assert task.extract(task.gold_completion(e, direct=False)) == e.answer
    assert all(verify_columns(s.completion) for s in task.seed_examples())
    assert AdditionTask().gold_completion(ex, direct=False).count("=") == 0  # the paper's stays the default
    longest = Example(id="99999+99999", question="", answer="199998", cls="5", fields={"a": 99999, "b": 99999})
    assert len((TargetHint().context(task, longest) + task.gold_completion(longest, False)).encode()) < 400


def test_digit_roles_of_the_columns_style():
    from star_arithmetic.formats import digit_roles, rationale_completion
    c = rationale_completion(29, 57, "columns")
    assert [(c[i], r) for i, r in digit_roles(c) if r != "copy"] == [
        ("1", "carry"), ("6", "sum"), ("0", "carry"), ("8", "sum"), ("8", "result"), ("6", "result")]
    rng = random.Random(3)
    for _ in range(50):
        a, b = rng.randrange(10 ** rng.randint(1, 6)), rng.randrange(10 ** rng.randint(1, 6))
        c = rationale_completion(a, b, "columns")
        sums = [c[i] for i, r in digit_roles(c) if r == "sum"]
        columns = max(len(str(a)), len(str(b)))
        assert "".join(reversed(sums)) == str(a + b).zfill(columns)[-columns:]
