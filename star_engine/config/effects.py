"""Settings that would be silently ignored: a key set to something other than its default that
another key makes pointless (``config.load_experiment`` finds them with ``pointless`` on the
validated configuration before anything is resolved, and hands them to ``refuse`` once every
other key is checked).

When the key that makes it pointless was given by ``--set`` (an ablation such as ``--set
rationalization.enabled=false``) or is a feature's switch set off in the file (``SWITCHES``: a
copied experiment with ``[base_training] steps = 0`` keeps its table), the settings only that
feature used are left unused with a note each, so that one ``--set`` is an ablation. Otherwise (a
feature's options set while it is off by default or by another setting: most likely a mistake)
the first is refused, naming both keys and the ``--set`` that would give it an effect.

A key left at its default is never pointless (flipping ``rationalization.enabled`` on a file that
spells out ``p_rationalization = 1.0`` says nothing the run would not do). A plugin checks its own
options likewise (``task.options.n_seed`` with ``seed_counts``: plugins/arithmetic).
"""

from __future__ import annotations

from typing import Any
from collections.abc import Callable

from ..errors import UserError

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


# The keys that switch a feature off: set in the file (a copied experiment with the feature
# switched off keeps its table), the settings only that feature used are left unused, with a note.
SWITCHES = ("rationalization.enabled", "training.source", "verifier.enabled", "base_training.steps")


def switched(data: dict[str, Any], key: str, src: Callable[[str], str]) -> bool:
    """Whether ``key`` switched its feature off on purpose: given by a ``--set`` (an ablation), or
    one of ``SWITCHES`` set in the file (``data``: the experiment as written, before defaults)."""
    if src(key).startswith("--set "):
        return True
    section, name = key.split(".", 1)
    table = data.get(section)
    return key in SWITCHES and isinstance(table, dict) and name in table


def refuse(rules: list[Rule], src: Callable[[str], str], switched: Callable[[str], bool] = lambda key: False
           ) -> list[str]:
    """The pointless keys (of ``pointless``): where the key that makes one pointless is
    ``switched`` (``switched``: an ablation by ``--set``, or a feature switched off in the file), a
    note each, returned; else (a feature's options set while it is off by default or by another
    setting: most likely a mistake) the first is refused: one line naming it (and where it was
    set), the key that makes it pointless and the ``--set`` that changes it."""
    notes = []
    for key, other, value in rules:
        origin = src(other)
        given = f" ({origin})" if origin.startswith("--set ") else ""
        if switched(other):
            notes.append(f"{src(key)}: {key}: has no effect when {other} = {_toml(value)}{given}; left unused")
            continue
        raise UserError(f"{key}: has no effect when {other} = {_toml(value)}{given}; remove {key}, or set {other} "
                        f"(e.g. --set {other}=...) so that it takes effect", key=key)
    return notes
