import math

import pytest

from star_engine import Registry, UserError
from star_schedules import plugin
from star_schedules.schedules import EpochsSchedule, ExponentialGrowSchedule, SteadyGrowSchedule


def table(schedule, iterations, n_examples=100, batch_size=8, grad_accum=1):
    return [schedule.steps(n, n_examples, batch_size, grad_accum) for n in range(1, iterations + 1)]


# ----------------------------------------------------------------------------- epochs


def test_epochs_original_defaults():
    # STaR defaults: 1.0 epochs + 0.2 per iteration, grad_accum 8, 10 sequences per batch
    s = EpochsSchedule()
    # 1000 kept examples: 1000 * [1.0, 1.2, 1.4, ...] / 80
    assert table(s, 8, 1000, 10, 8) == [12, 15, 17, 20, 22, 25, 27, 30]
    # 10,000 examples (the paper's n_train_samples, all kept)
    assert table(s, 4, 10_000, 10, 8) == [125, 150, 175, 200]


def test_epochs_formula_matches_floor():
    s = EpochsSchedule(base_epochs=2.0, add_epochs=0.5, min_steps=0)
    for n in range(1, 7):
        for count in (0, 1, 7, 99, 1234):
            expected = math.floor(count * (2.0 + 0.5 * (n - 1)) / 24)
            assert s.steps(n, count, 8, 3) == expected


def test_epochs_exact_arithmetic_avoids_float_floor_error():
    # 45 * 1.4 is 62.99999999999999 in floats; the schedule means 63
    assert EpochsSchedule().steps(3, 45, 1, 1) == 63


def test_epochs_zero_examples_is_zero_steps():
    assert EpochsSchedule().steps(1, 0, 8, 1) == 0
    assert EpochsSchedule(min_steps=5).steps(4, 0, 8, 8) == 0


def test_epochs_min_steps():
    assert EpochsSchedule().steps(1, 3, 8, 8) == 1  # floor(3/64) = 0 -> 1
    assert EpochsSchedule(min_steps=0).steps(1, 3, 8, 8) == 0
    assert EpochsSchedule(min_steps=10).steps(1, 100, 8, 1) == 12
    assert EpochsSchedule(min_steps=20).steps(1, 100, 8, 1) == 20


def test_epochs_max_steps():
    s = EpochsSchedule(max_steps=16)
    assert table(s, 5, 100, 8, 1) == [12, 15, 16, 16, 16]


# ----------------------------------------------------------------------------- steady_grow


def test_steady_grow_defaults():
    assert table(SteadyGrowSchedule(), 6) == [40, 60, 80, 100, 120, 140]


def test_steady_grow_options_and_cap():
    assert table(SteadyGrowSchedule(start_steps=10, add_steps=0), 3) == [10, 10, 10]
    assert table(SteadyGrowSchedule(start_steps=5, add_steps=3, max_steps=12), 5) == [5, 8, 11, 12, 12]


def test_steady_grow_ignores_example_count_but_not_zero():
    s = SteadyGrowSchedule()
    assert s.steps(2, 1, 8, 1) == s.steps(2, 10_000, 64, 8) == 60
    assert s.steps(2, 0, 8, 1) == 0


# ----------------------------------------------------------------------------- exponential_grow


def test_exponential_grow_paper_table():
    # "start at 40 steps, +20% per iteration", floored like the original's int()
    expected = [40, 48, 57, 69, 82, 99, 119, 143, 171, 206]
    assert table(ExponentialGrowSchedule(), 10) == expected
    # the original's float formula agrees on these iterations
    assert expected == [int(40 * 1.2 ** (n - 1)) for n in range(1, 11)]


def test_exponential_grow_floor_not_round():
    assert ExponentialGrowSchedule().steps(3, 1, 1, 1) == 57  # 57.6
    assert ExponentialGrowSchedule(start_steps=10, grow=1.5).steps(2, 1, 1, 1) == 15
    assert ExponentialGrowSchedule(start_steps=10, grow=1.25).steps(3, 1, 1, 1) == 15  # 15.625


def test_exponential_grow_shrinking_and_cap():
    assert table(ExponentialGrowSchedule(start_steps=100, grow=0.5), 4) == [100, 50, 25, 12]
    assert table(ExponentialGrowSchedule(max_steps=100), 8) == [40, 48, 57, 69, 82, 99, 100, 100]
    assert ExponentialGrowSchedule(max_steps=100).steps(64, 1, 1, 1) == 100


def test_exponential_grow_zero_examples():
    assert ExponentialGrowSchedule().steps(5, 0, 8, 1) == 0


# ----------------------------------------------------------------------------- validation


@pytest.mark.parametrize("name, options, message", [
    ("epochs", {"base_epochs": -1.0}, "base_epochs: must be >= 0, got -1.0"),
    ("epochs", {"base_epochs": "1"}, "base_epochs: expected a number, got string '1'"),
    ("epochs", {"add_epochs": float("nan")}, "add_epochs: must be a finite number, got nan"),
    ("epochs", {"add_epochs": -0.2}, "add_epochs: must be >= 0, got -0.2"),
    ("epochs", {"min_steps": -1}, "min_steps: must be >= 0, got -1"),
    ("epochs", {"min_steps": 1.5}, "min_steps: expected an integer, got number 1.5"),
    ("epochs", {"max_steps": -3}, "max_steps: must be >= 0, got -3"),
    ("steady_grow", {"start_steps": -40}, "start_steps: must be >= 0, got -40"),
    ("steady_grow", {"start_steps": 40.0}, "start_steps: expected an integer, got number 40.0"),
    ("steady_grow", {"add_steps": -20}, "add_steps: must be >= 0, got -20"),
    ("steady_grow", {"add_steps": True}, "add_steps: expected an integer, got boolean True"),
    ("steady_grow", {"max_steps": "0"}, "max_steps: expected an integer, got string '0'"),
    ("exponential_grow", {"grow": 0}, "grow: must be > 0, got 0"),
    ("exponential_grow", {"grow": -1.2}, "grow: must be > 0, got -1.2"),
    ("exponential_grow", {"grow": float("inf")}, "grow: must be a finite number, got inf"),
    ("exponential_grow", {"grow": False}, "grow: expected a number, got boolean False"),
    ("exponential_grow", {"start_steps": -1}, "start_steps: must be >= 0, got -1"),
    ("exponential_grow", {"max_steps": -1}, "max_steps: must be >= 0, got -1"),
    ("epochs", {"max_step": 3}, "max_step: unknown option for schedule 'epochs'"),
])
def test_bad_options(name, options, message):
    # the real path: the registry checks the options the factory declares, then builds it
    registry = Registry(autoload=False)
    registry.add(plugin)
    with pytest.raises(UserError) as e:
        registry.create("schedule", name, options, "training.schedule")
    assert str(e.value).startswith(f"training.schedule.{message}"), str(e.value)
    assert e.value.key == f"training.schedule.{message.split(':')[0]}"


def test_a_rule_across_options_names_the_option_after_the_table():
    registry = Registry(autoload=False)
    registry.add(plugin)
    with pytest.raises(UserError) as e:
        registry.create("schedule", "epochs", {"min_steps": 20, "max_steps": 10}, "training.schedule")
    assert str(e.value) == "training.schedule.min_steps: must not exceed max_steps (10), got 20"
    assert e.value.key == "training.schedule.min_steps"


def test_float_options_accept_integers():
    assert EpochsSchedule(base_epochs=1, add_epochs=0).steps(3, 80, 8, 1) == 10
    assert ExponentialGrowSchedule(grow=2).steps(3, 1, 1, 1) == 160


@pytest.mark.parametrize("schedule", [EpochsSchedule(), SteadyGrowSchedule(), ExponentialGrowSchedule()])
@pytest.mark.parametrize("args", [(0, 10, 8, 1), (1, -1, 8, 1), (1, 10, 0, 1), (1, 10, 8, 0),
                                  (1.0, 10, 8, 1), (True, 10, 8, 1)])
def test_bad_call_arguments(schedule, args):
    with pytest.raises(ValueError):
        schedule.steps(*args)
