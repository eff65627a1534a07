"""star-engine: a plugin-driven implementation of STaR (Self-Taught Reasoner).

This module is the plugin API's nouns: the records, protocols, jobs, errors and option
declarations a plugin (a task, checker, hint formatter, filter, schedule, sampler, tracker, a
backend, a command) is written against, named in ``__all__`` below and imported from here,
``from star_engine import Example, UserError, hookimpl``; the helpers it may use (reading data
files, atomic writes, seeds, ...) are ``star_engine.helpers``'s (moved there in 0.1.x: the old
names here still work until 0.2, with a ``DeprecationWarning``).
Every other module of the package is private: it may change in any release, and the
plugins of this repository do not import it (``tests/test_plugin_api.py`` checks). The
names are loaded on first use, so importing the package costs nothing (the CLI starts
from it). docs/plugins.md describes each group.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from typing import TYPE_CHECKING, Any

import pluggy

from .lazy import MovedModules, load as _load

from .version import __version__

hookimpl = pluggy.HookimplMarker("star_engine")
"""Decorator for plugin hook implementations."""

# name -> the private module that defines it
_SURFACE: dict[str, str] = {
    # records and protocols: what the core hands a plugin and expects back
    **dict.fromkeys(("Example", "DataFile", "TrainExample", "Candidate", "Verdict", "CheckContext"), "data"),
    **dict.fromkeys((
        "Progress", "Task", "Checker", "HintFormatter", "RationaleFilter", "StepSchedule", "QuestionSampler",
        "Backend", "MultiProcess", "ProbeSample", "Probe", "ReferenceProbe", "TuningChoice", "SamplingTuner",
        "GenerationEngine"), "api"),
    # the jobs a backend is given, and what it returns
    **dict.fromkeys(("GenSpec", "GenRequest", "TrainSpec", "TrainResult", "Packing", "Loss", "PACKINGS", "LOSSES",
                     "PreferencePair", "PreferenceSpec"), "jobs"),
    # failures that end a command with one line
    **dict.fromkeys(("UserError", "IntegrityError", "PluginError", "ProcessLost"), "errors"),
    # declaring options (types, ranges)
    "Section": "config.settings",
    **dict.fromkeys((
        "Range", "at_least", "above", "between", "NON_EMPTY", "NonNegInt", "PosInt", "NonNegFloat", "Fraction"),
        "config.schema"),
    "PROMPT_KINDS": "config.datafiles",
    "Registry": "config.registry",
}

# Helpers moved to star_engine.helpers (release 0.1.x); the old names work until 0.2, warning.
_MOVED = ("close_matches", "is_int", "is_number", "check_table", "load_experiment", "DATA_MAX", "check_option_path",
          "few_shot_prompts", "get", "prompt_files", "read_blocks", "read_capped", "read_jsonl", "fsync_dir",
          "temporary_sibling", "atomic_write_json", "derive_seed", "uniform_subset", "latest", "natural",
          "run_command")

__all__ = [  # the plugin API's nouns: hookimpl, __version__ and every name of _SURFACE
    "hookimpl", "__version__", "Example", "DataFile", "TrainExample", "Candidate", "Verdict", "GenSpec",
    "GenRequest", "TrainSpec", "TrainResult", "Progress", "Task", "Checker", "HintFormatter",
    "RationaleFilter", "StepSchedule", "QuestionSampler", "Backend", "MultiProcess", "Packing", "Loss",
    "PACKINGS", "LOSSES", "PreferencePair", "PreferenceSpec", "CheckContext", "ProbeSample", "Probe",
    "ReferenceProbe", "TuningChoice", "SamplingTuner", "GenerationEngine", "UserError", "IntegrityError", "PluginError", "ProcessLost",
    "Section", "Range", "at_least", "above", "between", "NON_EMPTY", "NonNegInt", "PosInt", "NonNegFloat",
    "Fraction", "PROMPT_KINDS", "Registry",
]


# Modules that moved into folders by concern (issue #40): the old paths work until 0.2, warning.
_MOVED_MODULES = {f"star_engine.{old}": f"star_engine.{new}" for old, new in {
    **{m: f"config.{m}" for m in ("schema", "settings", "effects", "smoke", "dataroot", "datafiles", "registry")},
    **{m: f"run.{m}" for m in ("runner", "loop", "stages", "stagebase", "verifying", "tuning", "experiment",
                               "questions", "tokens", "verdicts", "labelfree", "sweep", "trial")},
    **{m: f"rundir.{m}" for m in ("store", "records", "ledger", "metrics", "runlock", "fsio", "preferences", "procs")},
    **{m: f"report.{m}" for m in ("plot", "export", "datacheck", "compare", "compare_plot", "show", "status")},
}.items()}
if not any(isinstance(f, MovedModules) and f.moved == _MOVED_MODULES for f in sys.meta_path):
    sys.meta_path.append(MovedModules(_MOVED_MODULES, "0.2"))


def __getattr__(name: str) -> Any:
    if name in _MOVED:  # not cached: each use warns, so that every importer hears of it
        warnings.warn(f"star_engine.{name} moved to star_engine.helpers.{name}; the old name goes in release 0.2 "
                      f"(docs/plugins.md, 'Moved names')", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module("star_engine.helpers"), name)
    return _load(globals(), _SURFACE, name, __name__)


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:  # what the names are, for type checkers and editors
    from .data import Candidate, CheckContext, DataFile, Example, TrainExample, Verdict
    from .api import (Backend, Checker, GenerationEngine, HintFormatter, MultiProcess, Probe, ProbeSample, Progress,
                      QuestionSampler, RationaleFilter, ReferenceProbe, SamplingTuner, StepSchedule, Task,
                      TuningChoice)
    from .jobs import (LOSSES, PACKINGS, GenRequest, GenSpec, Loss, Packing, PreferencePair, PreferenceSpec,
                       TrainResult, TrainSpec)
    from .config.datafiles import PROMPT_KINDS
    from .errors import IntegrityError, PluginError, ProcessLost, UserError
    from .config.registry import Registry
    from .config.schema import NON_EMPTY, Fraction, NonNegFloat, NonNegInt, PosInt, Range, above, at_least, between
    from .config.settings import Section
