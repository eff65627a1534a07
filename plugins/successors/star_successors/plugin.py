"""Hook implementations: the random-reward and majority-vote checkers, the balance tuner and the group filter."""

from __future__ import annotations

from star_engine import hookimpl

from .balance import BalanceTuner
from .group import GroupFilter
from .majority import MajorityVote
from .random_reward import RandomReward


@hookimpl
def register_checkers(register):
    register("random_reward", RandomReward)
    register("majority_vote", MajorityVote)


@hookimpl
def register_tuners(register):
    register("balance", BalanceTuner)


@hookimpl
def register_filters(register):
    register("group", GroupFilter)
