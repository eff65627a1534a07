"""Settings every test folder shares: the fuzz tests' hypothesis profiles.

``ci`` (the default) is a fixed budget: ``derandomize=True`` makes every run draw the same
examples, so CI is reproducible, and each property's ``max_examples`` is fixed (``fuzz_budget``).
``HYPOTHESIS_PROFILE=thorough`` multiplies the budgets by 20 and draws new examples each run,
for a longer search on a developer's machine. The example counts are printed at the end of a
run (``--hypothesis-show-statistics`` in pyproject.toml's addopts).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

_common = {"deadline": None, "print_blob": True,
           "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large,
                                     HealthCheck.function_scoped_fixture]}
settings.register_profile("ci", derandomize=True, database=None, **_common)
settings.register_profile("thorough", derandomize=False, **_common)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
