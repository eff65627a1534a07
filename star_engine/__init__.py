"""star-engine: a plugin-driven implementation of STaR (Self-Taught Reasoner).

This module is the plugin API: everything a plugin (a task, checker, hint formatter,
filter, schedule, sampler, tracker, a backend, a command) may use is named in ``__all__``
below and imported from here, ``from star_engine import Example, UserError, hookimpl``.
Every other module of the package is private: it may change in any release, and the
plugins of this repository do not import it (``tests/test_plugin_api.py`` checks). The
names are loaded on first use, so importing the package costs nothing (the CLI starts
from it). docs/plugins.md describes each group.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

import pluggy

__version__ = "0.1.0"

hookimpl = pluggy.HookimplMarker("star_engine")
"""Decorator for plugin hook implementations."""

# name -> the private module that defines it
_SURFACE: dict[str, str] = {
    # records and protocols: what the core hands a plugin and expects back
    **dict.fromkeys((
        "Example", "DataFile", "TrainExample", "Candidate", "Verdict", "Progress", "Task", "Checker",
        "HintFormatter", "RationaleFilter", "StepSchedule", "QuestionSampler", "Backend", "MultiProcess",
        "CheckContext", "ProbeSample", "Probe", "ReferenceProbe", "TuningChoice", "SamplingTuner"), "api"),
    # the jobs a backend is given, and what it returns
    **dict.fromkeys(("GenSpec", "GenRequest", "TrainSpec", "TrainResult", "Packing", "Loss", "PACKINGS", "LOSSES",
                     "PreferencePair", "PreferenceSpec"), "jobs"),
    # failures that end a command with one line
    **dict.fromkeys(("UserError", "IntegrityError", "PluginError", "ProcessLost"), "errors"),
    # declaring options (types, ranges) and checking a table of them
    "Section": "settings",
    **dict.fromkeys((
        "Range", "at_least", "above", "between", "NON_EMPTY", "NonNegInt", "PosInt", "NonNegFloat", "Fraction",
        "close_matches", "is_int", "is_number"), "schema"),
    "check_table": "config",
    "load_experiment": "config",
    # reading users' data files, capped, with file:line errors
    **dict.fromkeys((
        "DATA_MAX", "PROMPT_KINDS", "check_option_path", "few_shot_prompts", "get", "prompt_files",
        "read_blocks", "read_capped", "read_jsonl"), "datafiles"),
    # writing files atomically
    **dict.fromkeys(("fsync_dir", "temporary_sibling"), "fsio"),
    "atomic_write_json": "store",
    # seeds, question draws, the run's records
    "derive_seed": "seeds",
    "uniform_subset": "questions",
    "latest": "ledger",
    "natural": "metrics",
    "Registry": "registry",
    # a plugin's own command, with the core's exit codes and one-line errors
    "run_command": "boundary",
}

__all__ = [  # the plugin API: hookimpl, __version__ and every name of _SURFACE
    "hookimpl", "__version__", "Example", "DataFile", "TrainExample", "Candidate", "Verdict", "GenSpec",
    "GenRequest", "TrainSpec", "TrainResult", "Progress", "Task", "Checker", "HintFormatter",
    "RationaleFilter", "StepSchedule", "QuestionSampler", "Backend", "MultiProcess", "Packing", "Loss",
    "PACKINGS", "LOSSES", "PreferencePair", "PreferenceSpec", "CheckContext", "ProbeSample", "Probe",
    "ReferenceProbe", "TuningChoice", "SamplingTuner", "UserError", "IntegrityError", "PluginError", "ProcessLost",
    "Section", "Range",
    "at_least", "above", "between", "NON_EMPTY", "NonNegInt", "PosInt", "NonNegFloat", "Fraction",
    "close_matches", "is_int", "is_number", "check_table", "load_experiment", "DATA_MAX", "PROMPT_KINDS",
    "check_option_path", "few_shot_prompts", "get", "prompt_files", "read_blocks", "read_capped",
    "read_jsonl", "fsync_dir", "temporary_sibling", "atomic_write_json", "derive_seed", "uniform_subset",
    "latest", "natural", "Registry", "run_command",
]


def __getattr__(name: str) -> Any:
    module = _SURFACE.get(name)
    if module is None:
        raise AttributeError(f"module 'star_engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"star_engine.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:  # what the names are, for type checkers and editors
    from .api import (Backend, Candidate, CheckContext, Checker, DataFile, Example, HintFormatter, MultiProcess, Probe,
                      ProbeSample, Progress, QuestionSampler, RationaleFilter, ReferenceProbe, SamplingTuner,
                      StepSchedule, Task, TrainExample, TuningChoice, Verdict)
    from .jobs import (LOSSES, PACKINGS, GenRequest, GenSpec, Loss, Packing, PreferencePair, PreferenceSpec,
                       TrainResult, TrainSpec)
    from .boundary import run_command
    from .config import check_table, load_experiment
    from .datafiles import (DATA_MAX, PROMPT_KINDS, check_option_path, few_shot_prompts, get, prompt_files,
                            read_blocks, read_capped, read_jsonl)
    from .errors import IntegrityError, PluginError, ProcessLost, UserError
    from .fsio import fsync_dir, temporary_sibling
    from .ledger import latest
    from .metrics import natural
    from .questions import uniform_subset
    from .registry import Registry
    from .schema import (NON_EMPTY, Fraction, NonNegFloat, NonNegInt, PosInt, Range, above, at_least, between,
                         close_matches, is_int, is_number)
    from .seeds import derive_seed
    from .settings import Section
    from .store import atomic_write_json
