"""A checker call is bounded in time wherever it runs: an answer whose verification would run for
ever (``10^{10^{10}}`` against a number: sympy computes the power exactly, inside C, where no
signal reaches it) returns within ``timeout_seconds`` as wrong and timed out, from the main thread
and from another one alike, and the next answer is judged by a fresh worker."""

from __future__ import annotations

import threading
import time

import pytest

from star_engine.errors import UserError
from star_mathverify.checker import MathVerifyChecker

HANG = "The answer is $\\boxed{10^{10^{10}}}$."
BOUND = 1.5
SLACK = 2.0  # killing the worker and reading its pipe, on a loaded machine


@pytest.fixture
def checker():
    c = MathVerifyChecker(timeout_seconds=BOUND)
    assert c.check_gold("5")  # the worker is up: what follows measures the bound, not a start
    yield c
    c.close()


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def test_a_runaway_answer_is_wrong_and_timed_out_within_the_bound(checker):
    v, seconds = timed(lambda: checker.check(HANG, None, "5"))
    assert v.timed_out and not v.correct and v.predicted is None
    assert BOUND <= seconds < BOUND + SLACK, seconds
    assert checker.worker.starts == 1
    v, _ = timed(lambda: checker.check("$\\boxed{5}$", None, "5"))
    assert v.correct and not v.timed_out and checker.worker.starts == 2  # a new worker judged it


def test_the_bound_holds_in_a_thread_too(checker):
    """math-verify's own timeout (signal.alarm) refuses to run outside the main thread; here the
    bound is the parent's wait, which works in any thread."""
    out = {}
    t = threading.Thread(target=lambda: out.update(v=timed(lambda: checker.check(HANG, None, "5"))))
    t.start()
    t.join(BOUND + SLACK + 5)
    assert not t.is_alive()
    v, seconds = out["v"]
    assert v.timed_out and not v.correct and seconds < BOUND + SLACK
    assert checker.check("$\\boxed{5}$", None, "5").correct


@pytest.mark.parametrize("bad_gold", ["refuse", "skip"])
def test_a_gold_answer_past_the_bound_counts_as_one_that_does_not_parse(bad_gold):
    """check_gold is bounded too. A bound of 0.1 ms is shorter than any parse (the worker is
    already up, so only the parse is timed)."""
    c = MathVerifyChecker(timeout_seconds=BOUND, bad_gold=bad_gold)
    try:
        assert c.check_gold("5")
        c.timeout_seconds = 1e-4
        gold = "\\frac{123456789}{987654321} + x^{2} - \\sqrt{17}"
        if bad_gold == "skip":
            assert c.check_gold(gold) is False
        else:
            with pytest.raises(UserError, match=r"does not parse: parsing it took more than timeout_seconds "
                                                r"\(0.0001 s\)"):
                c.check_gold(gold)
        c.timeout_seconds = 30.0
        assert c.check_gold(gold) and c.worker.starts == 2  # fine with time enough, in a new worker
    finally:
        c.close()
