"""Helpers a plugin may use, beside the nouns of ``star_engine`` (the records, protocols, jobs,
errors and option declarations a plugin is written against): ``from star_engine.helpers import
read_jsonl, get``. Like the package, this module loads each name on first use, so importing it
costs nothing. docs/plugins.md describes each group.

- reading users' data files, capped, with file:line errors: ``read_jsonl``, ``read_blocks``,
  ``read_capped``, ``DATA_MAX``, ``get`` (a field of a JSON row, typed), ``check_option_path``,
  ``prompt_files``, ``few_shot_prompts`` (a task's four few-shot prompts, as the original joins them);
- checking values and tables: ``check_table``, ``close_matches``, ``is_int``, ``is_number``;
  ``load_experiment`` (an experiment file, validated, as a plugin's own command reads one);
- writing files atomically: ``atomic_write_json``, ``temporary_sibling``, ``fsync_dir``;
- seeds and draws: ``derive_seed``, ``uniform_subset``; a run's records: ``latest`` (the ledger's
  last row per question), ``natural`` (a natural sort key);
- a plugin's own command, with the core's exit codes and one-line errors: ``run_command``;
- a completion cut before its first stop string, as every sampler cuts it: ``cut_at_stop``;
- a plugin that runs the command again in its own process (``os.execve``) sets ``RERUN_ENV`` in
  the environment it execs with, so that the command's notes are said once.

Until release 0.2 each name is also reachable as ``star_engine.<name>``, with a
``DeprecationWarning`` naming this module (docs/plugins.md, "Moved names").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .lazy import load as _load

# name -> the private module that defines it
HELPERS: dict[str, str] = {
    **dict.fromkeys(("DATA_MAX", "check_option_path", "few_shot_prompts", "get", "prompt_files", "read_blocks",
                     "read_capped", "read_jsonl"), "config.datafiles"),
    **dict.fromkeys(("close_matches", "is_int", "is_number"), "config.schema"),
    **dict.fromkeys(("check_table", "load_experiment"), "config.load"),
    **dict.fromkeys(("fsync_dir", "temporary_sibling", "atomic_write_json"), "rundir.fsio"),
    "derive_seed": "seeds",
    "uniform_subset": "run.questions",
    "latest": "rundir.ledger",
    "natural": "rundir.metrics",
    "run_command": "boundary",
    "cut_at_stop": "jobs",
    "RERUN_ENV": "ui",
}

__all__ = [  # every name of HELPERS
    "DATA_MAX", "RERUN_ENV", "atomic_write_json", "check_option_path", "check_table", "close_matches", "cut_at_stop", "derive_seed",
    "few_shot_prompts", "fsync_dir", "get", "is_int", "is_number", "latest", "load_experiment", "natural",
    "prompt_files", "read_blocks", "read_capped", "read_jsonl", "run_command", "temporary_sibling", "uniform_subset",
]


def __getattr__(name: str) -> Any:
    return _load(globals(), HELPERS, name, __name__)


def __dir__() -> list[str]:
    return list(__all__)


if TYPE_CHECKING:  # what the names are, for type checkers and editors
    from .boundary import run_command
    from .ui import RERUN_ENV
    from .config.load import check_table, load_experiment
    from .config.datafiles import (DATA_MAX, check_option_path, few_shot_prompts, get, prompt_files, read_blocks,
                                   read_capped, read_jsonl)
    from .rundir.fsio import atomic_write_json, fsync_dir, temporary_sibling
    from .rundir.ledger import latest
    from .rundir.metrics import natural
    from .run.questions import uniform_subset
    from .config.schema import close_matches, is_int, is_number
    from .seeds import derive_seed
    from .jobs import cut_at_stop
