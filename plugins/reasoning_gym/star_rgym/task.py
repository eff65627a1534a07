"""The ``reasoning_gym`` task: any of reasoning-gym's procedurally generated datasets.

Data are drawn, not read (``load(split, None)``; a data path is an error), from five *streams*
of the dataset, one per use: the splits ``train``, ``dev`` and ``test``, the few-shot examples
(``shots``) and the worked examples that train a base model (``seed``). reasoning-gym draws item
``i`` of a dataset seeded ``s`` from ``Random(s + i)``, so seed 42's item 1 is seed 43's item 0;
stream ``k`` is seeded ``k * STRIDE + seed`` with ``seed < 2**28`` and fewer than ``2**28`` items,
so the ``Random`` seeds of different streams lie in disjoint ranges whatever the seeds and sizes
(and stay below ``2**32``, which the datasets that seed numpy need). Questions can still repeat
by chance in a small problem space: ``train``, ``shots`` and ``seed`` leave out every question
of ``dev`` and ``test``, drawing further along their stream (``dev`` and ``test`` depend on their
own size and the seed alone).
"""

from __future__ import annotations

import json
import os
from functools import cached_property
from typing import Annotated, Any

from star_engine import NON_EMPTY, Example, Fraction, TrainExample, UserError, between
from star_engine.helpers import close_matches, is_number

from .config import canonical, plain, typed
from .formats import SEPARATOR, STOP, hinted
from .formats import completion as worked_completion
from .formats import context as question_context
from .formats import trim as trim_generation
from .gold import Ref, dataset, entry
from .library import dataset_classes, extract_answer, rg, short, system_prompts, version

SPLITS = ("train", "dev", "test")
STREAMS = ("train", "dev", "test", "shots", "seed")
HELD_OUT = ("dev", "test")
SIZE_KEYS = {"train": "size_train", "dev": "size_dev", "test": "size_test", "shots": "n_shots", "seed": "n_seed"}
"""The option that sets each stream's size (what an error about its size names)."""
STRIDE = 1 << 29
MAX_SEED = (1 << 28) - 1
MAX_SIZE = 1_000_000
MAX_SHOTS = 64
Size = Annotated[int, between(0, MAX_SIZE)]  # a stream's size (0: none)
PROMPT_KINDS = ("rationale", "direct", "hint", "direct_hint")
INSTRUCTIONS = ("auto", "none")
UNHASHED = frozenset({"isomorphic_strings", "knight_swap", "polynomial_multiplication", "ransom_note", "word_ladder"})
"""Datasets of reasoning-gym 0.1.25 whose items depend on Python's string hashing (they iterate
over sets of strings): the same seed draws other questions in another process unless
``PYTHONHASHSEED`` is fixed (found by drawing every dataset in two processes)."""


def stream_seed(seed: int, stream: str) -> int:
    """The reasoning-gym seed of ``stream`` (``STREAMS``) for the task's ``seed``."""
    return STREAMS.index(stream) * STRIDE + seed


def stream_size(stream: str, n: int) -> int:
    """The dataset size a stream of ``n`` items is drawn from: the held-out splits exactly
    ``n``; the others room to skip the held-out questions they meet."""
    return n if stream in HELD_OUT else 2 * n + 64


def metadata_field(entry: dict[str, Any], path: str) -> tuple[bool, Any]:
    """(found, value) of a dotted ``path`` in an entry's metadata."""
    value: Any = entry.get("metadata", {})
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return False, None
        value = value[part]
    return True, value


class ReasoningGymTask:
    """One reasoning-gym dataset. Options (README.md has them all with their defaults):

    - ``name``: the dataset (``reasoning_gym.factory.DATASETS``); ``config``: its own options,
      checked by its config class (``star_rgym.config``);
    - ``seed``; ``size_train``, ``size_dev``, ``size_test``: the splits' sizes (0: no such split);
    - ``n_shots``: examples in the few-shot prompt (0: zero-shot); ``instruction``: "auto"
      (reasoning-gym's "default" system prompt, its "direct" one for direct prompts), "none",
      or a key of ``reasoning_gym.utils.SYSTEM_PROMPTS`` for every prompt;
    - ``class_field``: the metadata field that gives an example's class ("auto": a composite's
      ``source_dataset``, else a scalar ``difficulty``, else "all"; "": "all"; dotted for nested);
    - ``rationale_field``: a metadata field holding a worked solution (gsm_symbolic: ``answer_cot``);
    - ``n_seed``, ``seed_hint_fraction``: worked examples to train a base model from scratch,
      and the share of them also given with the hint line.
    """

    default_checker = "reasoning_gym_score"
    default_hint = "reasoning_gym_answer"
    stop = STOP

    def __init__(self, *, name: Annotated[str, NON_EMPTY], config: dict[str, Any] | None = None,
                 seed: Annotated[int, between(0, MAX_SEED)] = 0,
                 size_train: Annotated[int, between(1, MAX_SIZE)] = 1000,
                 size_dev: Size = 200, size_test: Size = 0, n_shots: Annotated[int, between(0, MAX_SHOTS)] = 3,
                 instruction: str = "auto", class_field: str = "auto", rationale_field: str = "", n_seed: Size = 0,
                 seed_hint_fraction: Fraction = 0.0) -> None:
        rg()  # a missing package: one line naming it
        self.name = name
        dataset_classes(name, "name")
        config_args = typed(name, {} if config is None else config)
        self.config = canonical(plain(config_args))
        self.seed = seed
        self.sizes = {"train": size_train, "dev": size_dev, "test": size_test, "shots": n_shots, "seed": n_seed}
        self.seed_hint_fraction = seed_hint_fraction
        known = [*INSTRUCTIONS, *system_prompts()]
        if instruction not in known:
            raise UserError(f"instruction: must be one of {', '.join(map(repr, known))}, got {instruction!r}"
                            f"{close_matches(instruction, known)}")
        self.instruction, self.class_field, self.rationale_field = instruction, class_field, rationale_field
        self.version = version()
        self._splits: dict[str, list[Example]] = {}
        _require_stable_hashing(name, config_args)
        for stream in STREAMS:  # the config class and the constructors see every size the task uses
            if self.sizes[stream]:
                self._dataset(stream)
        first = next(s for s in ("dev", "test", "train") if self.sizes[s])
        self._draw_item(first, 0)  # a dataset without answers fails now

    # ------------------------------------------------------------------ data

    def _dataset(self, stream: str) -> Any:
        return dataset(self.name, self.config, stream_seed(self.seed, stream),
                            stream_size(stream, self.sizes[stream]), "config", SIZE_KEYS[stream])

    def _draw_item(self, stream: str, index: int) -> dict[str, Any]:
        try:
            item = entry(self.name, self.config, stream_seed(self.seed, stream),
                              stream_size(stream, self.sizes[stream]), index)
        except UserError:
            raise
        except Exception as e:  # noqa: BLE001  (a generator that fails on this configuration)
            raise UserError(f"task.options.config: reasoning-gym dataset {self.name!r} failed to draw item {index} "
                            f"of its {stream} stream: {short(e)}", key="task.options.config") from None
        if item.get("answer") is None:
            source = item.get("metadata", {}).get("source_dataset", self.name)
            raise UserError(f"task.options.name: reasoning-gym dataset {source!r} gives questions without an answer "
                            f"(answer is None; its score_answer does not score its own solution 1.0): there is no "
                            f"gold to check or hint; choose another dataset", key="task.options.name")
        return item

    @cached_property
    def _held_out(self) -> set[str]:
        return {item["question"] for s in HELD_OUT for _, item in self._items(s)}

    def _items(self, stream: str) -> list[tuple[int, dict[str, Any]]]:
        """The stream's ``n`` (index, entry) pairs: a held-out stream's first ``n`` items, another's
        first ``n`` items whose question is not held out."""
        n = self.sizes[stream]
        if not n:
            return []
        size = stream_size(stream, n)
        skip = set() if stream in HELD_OUT else self._held_out
        out = []
        for i in range(size):
            item = self._draw_item(stream, i)
            if item["question"] not in skip:
                out.append((i, item))
                if len(out) == n:
                    return out
        raise UserError(f"task.options.{SIZE_KEYS[stream]}: only {len(out)} of the first {size} questions of the "
                        f"{stream} stream are not dev or test questions: the configuration allows too few distinct "
                        f"questions (widen task.options.config, or ask for fewer)",
                        key=f"task.options.{SIZE_KEYS[stream]}")

    def _examples(self, stream: str) -> list[Example]:
        out = []
        for index, item in self._items(stream):
            answer = str(item["answer"])
            ref = Ref(answer, self.name, self.config, stream_seed(self.seed, stream),
                           stream_size(stream, self.sizes[stream]), index, self.version)
            qid = f"{stream}-{index}"
            fields: dict[str, Any] = {"answer": answer, "index": index}
            if self.rationale_field:
                fields["rationale"] = self._rationale(item, qid)
            out.append(Example(id=qid, question=str(item["question"]), answer=ref.encode(), cls=self._cls(item, qid),
                               fields=fields))
        return out

    def load(self, split: str, path: str | None) -> list[Example]:
        if path is not None:
            raise UserError(f"task.data.{split}: the reasoning_gym task draws its data; remove this path",
                            key=f"task.data.{split}")
        if split not in SPLITS:
            raise UserError(f"task.data.{split}: the reasoning_gym task has the splits {', '.join(SPLITS)}, "
                            f"not {split!r}", key=f"task.data.{split}")
        if not self.sizes[split]:
            raise UserError(f"task.options.size_{split}: is 0, so there is no {split} split; set it",
                            key=f"task.options.size_{split}")
        if split not in self._splits:
            self._splits[split] = self._examples(split)
        return list(self._splits[split])

    def _cls(self, item: dict[str, Any], qid: str) -> str:
        if not self.class_field:
            return "all"
        if self.class_field == "auto":
            meta = item.get("metadata", {})
            if self.name == "composite" and isinstance(meta.get("source_dataset"), str):
                return meta["source_dataset"]
            d = meta.get("difficulty")
            return str(d) if isinstance(d, str) or is_number(d) else "all"
        found, value = metadata_field(item, self.class_field)
        if not found:
            keys = ", ".join(sorted(item.get("metadata", {}))) or "none"
            raise UserError(f"task.options.class_field: {qid} of reasoning-gym dataset {self.name!r} has no "
                            f"metadata field {self.class_field!r} (its fields: {keys})", key="task.options.class_field")
        if isinstance(value, (str, int, float, bool)):
            return str(value)
        return json.dumps(plain(value), sort_keys=True, separators=(",", ":"), default=str)

    def _rationale(self, item: dict[str, Any], qid: str) -> str:
        found, value = metadata_field(item, self.rationale_field)
        if not found or not isinstance(value, str) or not value.strip():
            raise UserError(f"task.options.rationale_field: {qid} of reasoning-gym dataset {self.name!r} has no "
                            f"text in metadata field {self.rationale_field!r}", key="task.options.rationale_field")
        if any(s in worked_completion("", value) for s in self.stop):
            raise UserError(f"task.options.rationale_field: the rationale of {qid} holds a stop string "
                            f"({', '.join(map(repr, self.stop))})", key="task.options.rationale_field")
        return value

    # ------------------------------------------------------------------ formats

    def context(self, example: Example) -> str:
        return question_context(example.question)

    def prompt(self, kind: str) -> str:
        if kind not in PROMPT_KINDS:
            raise ValueError(f"unknown prompt kind {kind!r}; known: {', '.join(PROMPT_KINDS)}")
        direct, with_hint = kind.startswith("direct"), kind.endswith("hint")
        parts = []
        text = self._instruction(direct)
        if text:
            parts.append(text.strip() + SEPARATOR)
        for ex in self._shots:
            ctx = hinted(ex.question, ex.fields["answer"]) if with_hint else question_context(ex.question)
            parts.append(ctx + self.completion(ex, direct) + SEPARATOR)
        return "".join(parts)

    def _instruction(self, direct: bool) -> str:
        if self.instruction == "none":
            return ""
        which = ("direct" if direct else "default") if self.instruction == "auto" else self.instruction
        return system_prompts()[which]

    @cached_property
    def _shots(self) -> list[Example]:
        return self._examples("shots")

    def completion(self, example: Example, direct: bool) -> str:
        """The example's worked answer: with its rationale unless ``direct`` or there is none."""
        rationale = None if direct else example.fields.get("rationale")
        return worked_completion(example.fields["answer"], rationale)

    def trim(self, generation: str) -> str:
        return trim_generation(generation)

    def extract(self, generation: str) -> str | None:
        return extract_answer(generation)

    def gold_completion(self, example: Example, direct: bool) -> str:
        if not direct and "rationale" not in example.fields:
            raise UserError(f"task.options.rationale_field: reasoning-gym dataset {self.name!r} has no gold "
                            f"rationales to train on; name the metadata field that holds one (gsm_symbolic: "
                            f"\"answer_cot\"), or set task.direct = true", key="task.options.rationale_field")
        return self.completion(example, direct)

    def seed_examples(self) -> list[TrainExample]:
        seeds = self._examples("seed")
        without = [TrainExample(self.context(ex), self.completion(ex, False)) for ex in seeds]
        with_hint = [TrainExample(hinted(ex.question, ex.fields["answer"]), self.completion(ex, False))
                     for ex in seeds[: round(self.seed_hint_fraction * len(seeds))]]
        return without + with_hint


def _require_stable_hashing(name: str, config_args: dict[str, Any]) -> None:
    names = {name} | {spec.name for spec in config_args.get("datasets", [])} if name == "composite" else {name}
    unstable = sorted(names & UNHASHED)
    if unstable and not os.environ.get("PYTHONHASHSEED", "").isdigit():
        raise UserError(f"name: reasoning-gym dataset {unstable[0]!r} draws other questions in every Python process "
                        f"(it iterates over sets of strings), so a resumed run would see other questions: run with "
                        f"PYTHONHASHSEED=0 in the environment")
