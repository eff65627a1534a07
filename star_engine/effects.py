"""Settings that would be silently ignored: a key set to something other than its default that
another key makes pointless is an error naming both (``config.load_experiment`` finds them with
``pointless`` on the validated configuration before anything is resolved, and ``refuse``s the
first once every other key is checked).

A key left at its default is never an error (flipping ``rationalization.enabled`` with ``--set``
on a file that spells out ``p_rationalization = 1.0`` still works): only a value that says
something the run would not do is refused. A plugin does the same for its own options
(``task.options.n_seed`` with ``seed_counts``: plugins/arithmetic).
"""

from __future__ import annotations

from typing import Any
from collections.abc import Callable

from .errors import UserError

Rule = tuple[str, str, Any]  # (the pointless key, the key that makes it so, that key's value)


def _default(schema: dict[str, Any], key: str) -> Any:
    section, name = key.split(".", 1)
    return schema[section][name].default


def _value(cfg: dict[str, Any], key: str) -> Any:
    section, name = key.split(".", 1)
    return cfg[section][name]


class _Said(str):
    """A value shown as it is (not as a TOML string): a resolved one with its reason."""


def _toml(value: Any) -> str:
    if isinstance(value, _Said):
        return str(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return f'"{value}"' if isinstance(value, str) else repr(value)


def pointless(cfg: dict[str, Any], schema: dict[str, Any]) -> list[Rule]:
    """The keys of ``cfg`` (validated, not yet resolved, by ``schema``: ``config.SCHEMA``) set to
    something other than their default that have no effect, each with the key that decides so."""
    r, tr, ev, g = cfg["rationalization"], cfg["training"], cfg["evaluation"], cfg["generation"]
    rules: list[Rule] = []
    if tr["source"] == "gold" or not r["enabled"]:
        why = ("training.source", "gold") if tr["source"] == "gold" else ("rationalization.enabled", False)
        rules += [(k, *why) for k in ("rationalization.p_rationalization", "rationalization.p_show_hint_save",
                                      "task.hint")]
    if tr["source"] == "gold":  # the dataset's completions are kept as they are
        rules += [(k, "training.source", "gold") for k in ("task.filters", "task.reward", "generation.tuner",
                                                           "experiment.collapse_patience")]
    if g["samples_per_question"] == 1:  # the collapse guard watches the agreement of a question's samples
        rules.append(("experiment.collapse_patience", "generation.samples_per_question", 1))
    if not cfg["verifier"]["enabled"]:
        rules += [(f"verifier.{k}", "verifier.enabled", False) for k in schema["verifier"] if k != "enabled"]
    if cfg["base_training"]["steps"] == 0:
        rules += [(f"base_training.{k}", "base_training.steps", 0) for k in schema["base_training"] if k != "steps"]
    # The sampled evaluation (evaluation.samples_per_question, resolved as EvaluationSection.resolve_inherited does)
    n = ev["samples_per_question"] or (g["samples_per_question"] if g["temperature"] > 0 else 1)
    if n <= 1:
        if ev["samples_per_question"]:
            said: Any = n
        elif g["temperature"] > 0:
            said = _Said(f"0 (which follows [generation] here: {g['samples_per_question']} sample per question)")
        else:
            said = _Said("0 (which is 1 here: generation.temperature is 0)")
        rules += [(f"evaluation.{k}", "evaluation.samples_per_question", said) for k in ("sample_temperature", "pass_k")]
    if ev["temperature"] == 0:
        rules.append(("evaluation.top_p", "evaluation.temperature", 0.0))
    if g["temperature"] == 0 and n <= 1:  # a sampled evaluation samples with generation.top_p
        rules.append(("generation.top_p", "generation.temperature", 0.0))
    return [rule for rule in rules if _value(cfg, rule[0]) != _default(schema, rule[0])]


def refuse(rules: list[Rule], src: Callable[[str], str]) -> None:
    """Refuse the first pointless key (of ``pointless``): one line naming it (and where it was set)
    and the key that makes it pointless (and its ``--set``, when one gave it)."""
    for key, other, value in rules:
        origin = src(other)
        given = f" ({origin})" if origin.startswith("--set ") else ""
        raise UserError(f"{src(key)}: {key}: has no effect when {other} = {_toml(value)}{given}; remove {key} "
                        f"(or change {other})")
