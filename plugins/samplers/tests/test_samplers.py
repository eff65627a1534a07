"""Each built-in sampler's rule, its options, and its registration through the entry point."""

from __future__ import annotations

import inspect
import math
import tomllib
from collections import Counter
from importlib import metadata
from pathlib import Path

import pluggy
import pytest

from star_engine import hooks
from star_engine.api import Example
from star_engine.errors import UserError
from star_engine.config.registry import Registry
from star_engine.run.stages import derive_seed
from star_samplers import plugin
from hypothesis import given, strategies as st
from star_samplers.samplers import AdaptiveSampler, CurriculumSampler, StratifiedSampler, UniformSampler

ROOT = Path(__file__).resolve().parents[1]
QS = [Example(f"q{i}", f"{i}+1", str(i + 1), str(1 + i % 3)) for i in range(30)]


def row(n, q, cls, solved, times_solved=0, last_solved=None, hint=False):
    return {"iteration": n, "question_id": q, "class": cls, "solved": solved, "solved_with_hint": hint,
            "times_solved": times_solved, "last_solved": last_solved, "times_seen": 1}


def test_registered_through_the_hook():
    pm = pluggy.PluginManager("star_engine")
    pm.add_hookspecs(hooks)
    pm.register(plugin, name="samplers")
    pm.check_pending()
    found = {}
    pm.hook.register_samplers(register=lambda name, factory: found.setdefault(name, factory))
    assert found == {"uniform": UniformSampler, "adaptive": AdaptiveSampler, "curriculum": CurriculumSampler,
                     "stratified": StratifiedSampler}


def test_entry_point_declared():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["star_engine"] == {"samplers": "star_samplers.plugin"}
    try:
        dist = metadata.distribution("star-engine-samplers")
    except metadata.PackageNotFoundError:
        return
    assert [(e.name, e.value) for e in dist.entry_points if e.group == "star_engine"] == \
        [("samplers", "star_samplers.plugin")]


@pytest.mark.parametrize("factory", plugin.SAMPLERS.values())
def test_options_are_keyword_only(factory):
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in inspect.signature(factory).parameters.values())


def test_uniform_is_the_seeded_subset_the_core_draws():
    got = UniformSampler().select(3, QS, 7, [], 11)
    want = sorted(QS, key=lambda q: derive_seed(11, 3, q.id, "subset"))[:7]
    assert sorted(got) == sorted(q.id for q in want)
    assert UniformSampler().select(3, QS, 30, [], 11) == [q.id for q in QS]
    assert sorted(UniformSampler().select(3, list(reversed(QS)), 7, [], 11)) == sorted(got)  # order-free


def test_adaptive_weights():
    s = AdaptiveSampler(floor=0.1, power=1.0)
    assert s.weight(4, None) == 1.0  # never seen
    assert s.weight(4, row(3, "q", "1", False)) == 1.0  # seen, never solved
    assert s.weight(4, row(3, "q", "1", True, 1, 3)) == pytest.approx(0.1 + 0.9 * (1 / 4) / 2)
    assert s.weight(4, row(3, "q", "1", True, 1, 1)) == pytest.approx(0.1 + 0.9 * (3 / 4) / 2)
    assert s.weight(4, row(3, "q", "1", True, 3, 3)) == pytest.approx(0.1 + 0.9 * (1 / 4) / 4)
    assert AdaptiveSampler(power=0.0).weight(4, row(3, "q", "1", True, 3, 1)) == pytest.approx(0.1 + 0.9 * 0.75)


def test_adaptive_prefers_what_was_rarely_or_long_ago_solved():
    """Half the questions were solved at iteration 1 (weight 0.1 + 0.9 * (1/2) / 2 = 0.325 at
    iteration 2), half never (weight 1): over many seeds the never-solved half is drawn far
    more often, the solved half still sometimes."""
    solved = {q.id for q in QS[:15]}
    ledger = [row(1, q.id, q.cls, q.id in solved, int(q.id in solved), 1 if q.id in solved else None) for q in QS]
    counts = Counter()
    for seed in range(300):
        ids = AdaptiveSampler().select(2, QS, 10, ledger, seed)
        assert len(ids) == len(set(ids)) == 10
        counts.update(ids)
    hard = sum(counts[q.id] for q in QS[15:])
    easy = sum(counts[q.id] for q in QS[:15])
    assert hard > 2 * easy and easy > 0
    # Solved long ago weighs more than solved just now.
    old = [row(1, q.id, q.cls, True, 1, 1) for q in QS[:15]] + [row(5, q.id, q.cls, True, 1, 5) for q in QS[15:]]
    counts = Counter(i for seed in range(300) for i in AdaptiveSampler().select(6, QS, 10, old, seed))
    assert sum(counts[q.id] for q in QS[:15]) > 2 * sum(counts[q.id] for q in QS[15:])


def test_adaptive_is_deterministic_and_order_free():
    ledger = [row(1, q.id, q.cls, i % 2 == 0, i % 2, 1 if i % 2 == 0 else None) for i, q in enumerate(QS)]
    a = AdaptiveSampler().select(2, QS, 12, ledger, 5)
    assert a == AdaptiveSampler().select(2, QS, 12, ledger, 5)
    assert sorted(a) == sorted(AdaptiveSampler().select(2, list(reversed(QS)), 12, ledger, 5))
    assert sorted(a) != sorted(AdaptiveSampler().select(2, QS, 12, ledger, 6))


def test_adaptive_draws_are_weighted_sampling_without_replacement():
    """One draw of n = 1: each question's share of many seeds approaches its weight's share."""
    ledger = [row(1, "q0", "1", True, 2, 1)] + [row(1, q.id, q.cls, False) for q in QS[1:3]]
    s = AdaptiveSampler(floor=0.2)
    qs = QS[:3]
    wins = Counter(s.select(2, qs, 1, ledger, seed)[0] for seed in range(3000))
    w = [s.weight(2, r) for r in ledger]
    assert wins["q0"] / 3000 == pytest.approx(w[0] / sum(w), abs=0.03)


def test_curriculum_opens_classes_in_order():
    c = CurriculumSampler(threshold=0.5)
    assert c.classes(QS) == ["1", "2", "3"]
    assert set(c.open_classes(QS, [])) == {"1"}
    assert {QS[i].cls for i in map(lambda x: int(x[1:]), c.select(1, QS, 30, [], 0))} == {"1"}
    # Class 1 solved by 6 of 10 at iteration 1: class 2 opens; class 2 at 2 of 10 keeps 3 shut.
    ledger = [row(1, q.id, q.cls, i < 18) for i, q in enumerate(QS) if q.cls == "1"]
    assert c.open_classes(QS, ledger) == ["1", "2"]
    ledger += [row(2, q.id, q.cls, i < 6) for i, q in enumerate(QS) if q.cls == "2"]
    assert c.open_classes(QS, ledger) == ["1", "2"]
    # The latest iteration that drew a class decides: class 2 at 9 of 10 in iteration 3 opens 3.
    ledger += [row(3, q.id, q.cls, i < 27) for i, q in enumerate(QS) if q.cls == "2"]
    assert c.open_classes(QS, ledger) == ["1", "2", "3"]
    ids = c.select(4, QS, 12, ledger, 0)
    assert len(ids) == 12 and len(set(ids)) == 12
    # Fewer open questions than asked for: all of them.
    assert sorted(c.select(2, QS, 25, ledger[:10], 0)) == sorted(q.id for q in QS if q.cls in ("1", "2"))


def test_curriculum_order_option():
    c = CurriculumSampler(order=["3", "1"], threshold=0.0)
    assert c.classes(QS) == ["3", "1", "2"]  # unlisted classes follow
    assert CurriculumSampler(order=["3"]).open_classes(QS, []) == ["3"]


@pytest.mark.parametrize("name, options, says", [
    ("adaptive", {"floor": 0.0}, "generation.sampler.floor: must be in (0, 1], got 0.0"),
    ("adaptive", {"power": "x"}, "generation.sampler.power: expected a number, got string 'x'"),
    ("adaptive", {"power": -1}, "generation.sampler.power: must be >= 0, got -1"),
    ("curriculum", {"threshold": 1.5}, "generation.sampler.threshold: must be in [0, 1], got 1.5"),
    ("curriculum", {"order": "123"}, "generation.sampler.order: expected a list of strings, got string '123'"),
    ("curriculum", {"order": ["1", ""]}, "generation.sampler.order: must be a list of non-empty strings"),
    ("curriculum", {"ordr": []}, "generation.sampler.ordr: unknown option for sampler 'curriculum'"),
])
def test_bad_options_name_the_key(name, options, says):
    reg = Registry(autoload=False)
    reg.add(plugin)
    with pytest.raises(UserError) as e:
        reg.create("sampler", name, options, "generation.sampler")
    assert str(e.value).startswith(says), str(e.value)
    assert e.value.key.startswith("generation.sampler")


def test_weights_are_finite_for_any_history():
    s = AdaptiveSampler(floor=1e-9, power=50.0)
    w = s.weight(1000, row(999, "q", "1", True, 999, 999))
    assert w > 0 and math.isfinite(math.log(0.5) / w)


@given(st.dictionaries(st.sampled_from("abcdefg"), st.integers(0, 40), min_size=1), st.integers(0, 200))
def test_stratified_shares_are_equal_where_the_classes_allow(sizes, n):
    shares = StratifiedSampler.shares(sizes, n)
    assert set(shares) == set(sizes)
    assert sum(shares.values()) == min(n, sum(sizes.values()))
    assert all(0 <= shares[c] <= sizes[c] for c in sizes)
    short = [c for c in sizes if shares[c] < sizes[c]]  # classes that could have given more
    if short:
        low = min(shares[c] for c in short)
        assert max(shares[c] for c in short) - low <= 1
        assert all(shares[c] <= low + 1 for c in sizes)  # nobody got more than a full share


def test_stratified_draws_every_class_equally_and_a_small_class_whole():
    qs = [Example(f"a{i}", "", "", "1") for i in range(5)] + \
         [Example(f"b{i}", "", "", "2") for i in range(100)] + [Example(f"c{i}", "", "", "3") for i in range(100)]
    got = StratifiedSampler().select(2, qs, 65, [], 7)
    assert len(got) == len(set(got)) == 65
    by = Counter(i[0] for i in got)
    assert by == {"a": 5, "b": 30, "c": 30}
    assert sorted(StratifiedSampler().select(2, list(reversed(qs)), 65, [], 7)) == sorted(got)  # order-free
    assert StratifiedSampler().select(3, qs, 65, [], 7) != got  # a new draw each iteration
    assert sorted(StratifiedSampler().select(2, qs, 500, [], 7)) == sorted(q.id for q in qs)
    # The uniform draw would have taken about 65 * 5 / 205 = 1.6 of the small class.
    assert Counter(i[0] for i in UniformSampler().select(2, qs, 65, [], 7))["a"] < 5
