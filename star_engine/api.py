"""The contracts between the core and its plugins.

Every component a plugin registers is a *factory*: a callable taking the keyword
options from its TOML table and returning an object of one of the protocols
below. The core only ever talks to these protocols; it knows no task, checker or
model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable
from collections.abc import Callable, Mapping, Sequence

from .data import (Candidate as Candidate, CheckContext as CheckContext, DataFile as DataFile,  # re-exported
                   Example as Example, TrainExample as TrainExample, Verdict as Verdict)
from .jobs import GenRequest, GenSpec, PreferencePair, PreferenceSpec, TrainResult, TrainSpec
from .probes import Probe, ProbeSample as ProbeSample, ReferenceProbe as ReferenceProbe, TuningChoice  # re-exported

Progress = Callable[[int], None]
"""Called with the number of items just finished (for progress bars)."""


# ----------------------------------------------------------------------------- components
# (the jobs a Backend is given, GenSpec ... PreferenceSpec: star_engine/jobs.py)


@runtime_checkable
class Task(Protocol):
    """A dataset and how to talk to a model about it.

    Optional method (the core calls it when a task has it):

    ``trim(generation: str) -> str``
        The part of a generation that counts: what is checked (``extract``, the
        checker) and stored (the rationale trained on, the evaluation's
        ``generation``). A task whose model writes on after its answer cuts it here,
        as the original STaR code keeps only CQA's first line. Without it the whole
        generation (already cut before the first stop string) counts.

    Optional attribute of the task's factory (a class attribute; the core reads it without
    building the task):

    ``data_files: Sequence[DataFile]``
        The files the task reads from the data root in their public releases, with their
        sha256, source and licence: what ``star-engine data check`` compares the files there
        with (a file of an experiment that is not listed is only checked to be there).
    """

    default_checker: str
    default_hint: str

    def load(self, split: str, path: str | None) -> list[Example]:
        """Examples of ``split``; ``path`` is ``task.data.<split>`` from the TOML
        (relative paths already resolved) or None for tasks that generate data.
        Raises ``star_engine.errors.UserError`` naming ``file:line`` on bad data."""

    def context(self, example: Example) -> str:
        """The hint-free question context, ending in the answer cue ("A:")."""

    def prompt(self, kind: str) -> str:
        """Few-shot prefix; ``kind`` is "rationale", "direct", "hint" (rationalization)
        or "direct_hint" (rationalization when ``task.direct``). May be "". The core
        asks for the kinds a run uses when it builds the experiment."""

    def extract(self, generation: str) -> str | None:
        """The answer stated in ``generation`` (None when there is none)."""

    def gold_completion(self, example: Example, direct: bool) -> str:
        """The training completion built from gold data (direct answer, or the
        dataset's own rationale when it has one). Raises UserError if impossible."""

    def seed_examples(self) -> list[TrainExample]:
        """Worked examples used to train a base model from scratch (may be [])."""

    stop: tuple[str, ...]
    """Strings that end a generation (the generation is cut before them)."""


class Checker(Protocol):
    """Judges generations against gold answers (``task.checker``; ``[evaluation] checkers``).

    Optional method (the core calls it when a checker has it):

    ``check_gold(gold: str) -> bool``
        Whether ``gold`` (an ``Example.answer``) can be judged against, asked once per question
        of every split the checker judges, when the data is loaded (before anything is
        written; ``validate`` too). True: it can (a checker that parses gold answers parses
        and caches it here, once per question). False: skip the question: the task's checker
        has it left out of its split, an ``[evaluation] checkers`` entry leaves it unjudged
        (a null verdict); the run's events count them (``gold_skipped``). Raise
        ``UserError(why)`` to refuse the data: the core puts the file and row in front
        (``path: row 12 (question 'test-11'): checker 'math_verify': why``) and the command
        exits with code 2, nothing written. Which of the last two is the checker's option.

    ``check_in(context: CheckContext, generation: str, extracted: str | None, gold: str) -> Verdict``
        Called instead of ``check`` when present: the same judgement, told where the generation
        comes from (``CheckContext``: seed, iteration, question, sample, stage), for a checker
        whose verdict depends on it (the ``random_reward`` control draws its coin from it).

    ``check_group(contexts: Sequence[CheckContext], generations: Sequence[str], extracted: Sequence[str | None], gold: str) -> list[Verdict]``
        With a class attribute ``min_group: int``: a checker that judges one question's samples
        together (``capabilities.ChecksGroups``), one verdict per sample in the order given (the
        ``majority_vote`` reward's pseudo-label is the question's majority answer). The core
        calls it instead of ``check`` for each question's samples of a training stage (the
        generation, a tuner's probes), a generation judged alone as a group of one; such a
        checker can only be ``task.reward``, and ``generation.samples_per_question`` (a tuner's
        probes) must be at least ``min_group`` (refused with one line naming the key).

    ``check_many(items: Sequence[tuple[str, str | None, str]]) -> list[Verdict]``
        ``check`` of each (generation, extracted, gold), in order: the core hands it a stage's
        generations at once (a checker without ``check_in`` or ``check_group``), so that it can
        judge them in parallel (``python_tests`` with ``workers``).

    Optional attribute: ``label_free: bool`` (``capabilities.LabelFree``): True when the verdicts
    never read ``gold``. As ``task.reward`` such a checker may train on questions without a gold
    answer (``task.train_split``: test-time training); rationalization, whose hint is the gold
    answer, must then be off.
    """

    def check(self, generation: str, extracted: str | None, gold: str) -> Verdict:
        """Judge one generation; ``extracted`` is the task's extraction (``Task.extract`` of
        the trimmed ``generation``; None when it found no answer). Extraction is the
        task's: a checker interprets and compares ``extracted`` with ``gold``, and reads
        ``generation`` only when its own rule replaces the task's (the ``regex`` checker)."""


class HintFormatter(Protocol):
    def context(self, task: Task, example: Example) -> str:
        """The context with the gold answer given as a hint."""

    def leak_strings(self, task: Task, example: Example) -> tuple[str, ...]:
        """Text that betrays the hint if it appears in a stored rationale."""


class RationaleFilter(Protocol):
    """Decides which of an iteration's right rationales are trained on (``task.filters``).

    Optional method (the core calls it instead of ``keep`` when a filter has it):

    ``keep_among(candidates, others, history) -> list[bool]``
        As ``keep``, also shown ``others``: the iteration's rationales no longer candidates
        (rejected by the checker or an earlier filter), so that a filter can judge a question's
        samples as a group (the ``group`` filter drops questions whose samples were all right).

    ``decline(generated, history) -> Collection[str]``
        Question ids taken out of the iteration before rationalization, given its ``generated``
        (hint-free) candidates, right and wrong: they are not rationalized and their samples are
        rejected by the filter (the ``group`` filter declines the questions whose samples were
        all wrong, as Reinforce-Rej does).
    """

    def keep(self, candidates: Sequence[Candidate], history: Sequence[Candidate]) -> list[bool]:
        """One flag per candidate. ``history`` is what earlier iterations kept.
        Must be deterministic."""


class StepSchedule(Protocol):
    def steps(self, iteration: int, n_examples: int, batch_size: int, grad_accum: int) -> int:
        """Optimizer steps for STaR iteration ``iteration`` (1-based)."""


class QuestionSampler(Protocol):
    """Which train questions a STaR iteration draws (``generation.sampler``)."""

    def select(self, iteration: int, questions: Sequence[Example], n: int,
               ledger: Sequence[Mapping[str, Any]], seed: int) -> list[str]:
        """The ids of at most ``n`` distinct questions of ``questions`` (the train split, in
        its order) for STaR iteration ``iteration`` (1-based). ``ledger`` holds the rows of
        ``questions.parquet`` of the iterations before (``star_engine.rundir.ledger.LEDGER_SCHEMA``);
        ``seed`` is the experiment's. Must be deterministic: the same arguments, the same ids
        (a resumed run asks again). The order of the ids does not matter."""


class SamplingTuner(Protocol):
    """Chooses, each STaR iteration, the temperature its rationales are sampled at
    (``generation.tuner``), from what the iteration's model does at a few (``Probe``)."""

    def tune(self, iteration: int, questions: Sequence[Example], probe: Probe, seed: int) -> TuningChoice:
        """Before iteration ``iteration`` (1-based) generates: ``questions`` are the ones it
        drew; ``seed`` the experiment's. Must be deterministic (a resumed run asks again and
        gets the stored probes back)."""


class GenerationEngine(Protocol):
    """What samples the run's prompts instead of the backend's own ``generate``
    (``[generation] engine``, options from the ``[generation.server]`` table): e.g. an
    OpenAI-compatible inference server (``star_server``). Every stage that samples
    (generation, rationalization, evaluation, a tuner's probes) goes through it, chunk by chunk.

    The run calls ``start`` once, after every check and before the first chunk; ``close``
    once when the run ends, fails or is interrupted (the engine stops what it started);
    ``generate`` as ``Backend.generate`` is called: one completion per request, cut before
    the first stop string, each request's ``seed`` alone deciding its randomness."""

    def start(self, run_dir: Path, backend: Backend) -> None:
        """Before the first ``generate``: ``run_dir`` the run directory (the engine may keep
        files under ``run_dir / "served"``), ``backend`` the run's backend (its checkpoints are
        the ones ``generate`` names)."""

    def generate(self, checkpoint: str, requests: Sequence[GenRequest], spec: GenSpec,
                 progress: Progress | None = None) -> list[str]:
        """One completion per request, sampled from exactly ``checkpoint``'s weights."""

    def provenance(self) -> tuple[str, str]:
        """(model version, sampled by) of the texts the last ``generate`` returned: the content
        hash of the weights that produced them and who produced them (a server's URL and model
        name); the run records both in each row."""

    def close(self) -> None:
        """Stop whatever ``start`` and ``generate`` started; idempotent."""


class Backend(Protocol):
    """A model family. Checkpoints are directories the backend writes atomically.

    Its options are the keyword parameters of its factory, or the fields of its ``Options``
    dataclass (the ``[model]`` table less ``backend``, checked before it is built, like every
    component's); their defaults are
    recorded in ``config.json``'s ``[model]`` beside the options the file sets
    (``registry.option_defaults``), so that the resolved configuration names every option the
    backend ran with. A default of ``None`` says "the backend decides" (from a preset, its files,
    the machine): ``describe`` records what it decided. A resumed run whose recorded default
    differs from the factory's now is refused, as a changed option.

    A backend that runs as several processes (one per host) is also a
    ``MultiProcess``; the core then writes the run directory from process 0 only
    (``star_engine.rundir.procs``). Checkpoint writes are the backend's: it too must write
    them once, and return from ``train`` only when they are visible to every process."""

    def validate_run(self, generation: Mapping[str, GenSpec], training: Mapping[str, TrainSpec]) -> None:
        """Optional. Check, before the run writes anything, everything ``generate`` and
        ``train`` would refuse for these specs (context length against ``max_new_tokens``,
        sampling values, optimizer tables) and the backend's own files (checkpoint paths,
        tokenizer files); raise ``UserError`` naming the TOML key (``generation.max_new_tokens:
        ...``). ``generation`` maps a TOML section ("generation", "evaluation") to the spec the
        run will sample with; ``training`` maps "base_training" (when it trains) and
        "training" to a ``TrainSpec`` whose ``steps`` is 0 where the schedule decides it per
        iteration. ``star-engine validate`` and ``run`` call it (``runner.preflight``)."""

    optimizer_table: type
    """Optional. The typed section (a frozen dataclass deriving from ``star_engine.Section``,
    each field an option: its type, ``typing.Annotated`` range markers and default) of the ``[base_training.optimizer]`` and
    ``[training.optimizer]`` tables, which are the backend's: a class attribute of its
    factory. ``config.load_experiment`` checks each table against it (unknown keys, types,
    ranges: one line naming the key and the file or ``--set``) and fills in its defaults, so
    ``config.json`` records what trains and ``TrainSpec.optimizer`` arrives complete. Without
    it the tables reach ``validate_run`` and ``train`` as written."""

    adapter_kinds: tuple[str, ...]
    """Optional. The kinds of ``[base_training.adapter]`` / ``[training.adapter]`` table this
    backend trains (parameter-efficient fine-tuning, ``TrainSpec.adapter``; e.g. ``("lora",)``),
    a class attribute of its factory. ``config.load_experiment`` refuses a table of another
    kind, or any table when the backend has none; the backend checks the rest against its
    model in ``validate_run``."""

    def start(self) -> None:
        """Optional. Start the backend's runtime (its devices, processes, threads, caches): the
        run calls it once, after every check (``runner.preflight``) and before it writes
        anything; ``star-engine validate`` never does, so building a backend and
        ``validate_run`` must start nothing. A backend may run its command again here (``exec``,
        same arguments) to change what only a process start sets (``GLIBC_TUNABLES``)."""

    def matmul_gflops(self) -> float:
        """Optional. The fp32 matmul speed this backend's runtime reaches on this machine, in
        GFLOP/s, measured now (after ``start``; in well under a second): the figure a run's time
        scales with on a CPU. The run logs it (``machine_speed``), prints the time it expects
        when the experiment gives ``experiment.expected_minutes`` at ``expected_gflops``, and
        names it in its summary's machine line."""

    def checkpoint_recorded(self, checkpoint: str) -> None:
        """Optional. The run has recorded the fine-tuning stage that wrote ``checkpoint`` (its
        ``train.json`` is written; a resumed run that finds the stage recorded says so again):
        whatever the backend kept to redo that stage after a kill (a training snapshot) may go
        now. Before this call a kill makes the run train the stage again, so such state must
        stay until then."""

    def base(self, workdir: Path, seed: int) -> str:
        """The base checkpoint: the configured weights, or a fresh random
        initialisation written under ``workdir`` (idempotent)."""

    def checkpoint_id(self, checkpoint: str) -> str:
        """Stable content id of a checkpoint."""

    def train(self, init: str, out: Path, examples: Sequence[TrainExample], spec: TrainSpec,
              progress: Progress | None = None) -> TrainResult:
        """Fine-tune from ``init`` and write the result to ``out`` atomically.
        Same inputs give the same parameters."""

    def generate(self, checkpoint: str, requests: Sequence[GenRequest], spec: GenSpec,
                 progress: Progress | None = None) -> list[str]:
        """One completion per request, cut before the first stop string."""

    def describe(self) -> Mapping[str, Any]:
        """JSON-serialisable description (config, tokenizer) for the run manifest."""

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Optional. The number of tokens of each text in the backend's tokenizer (the
        per-question ledger's ``tokens``, the kept set's lengths, prompts against
        ``prompt_capacity``); without it the core counts UTF-8 bytes."""

    def prompt_capacity(self, spec: GenSpec) -> int:
        """Optional. The most tokens of a prompt (as ``count_tokens`` counts them) that
        ``generate`` keeps under ``spec``: a longer prompt is left-truncated (it keeps its end;
        typically the context length less ``spec.max_new_tokens``). The core counts, per stage,
        the prompts longer than this (``prompts_truncated`` in ``metrics.parquet``, a
        ``prompts_truncated`` warning event); without it no prompt counts as cut. A backend
        that has it should have ``count_tokens`` too (else prompts are counted in bytes)."""

    def export_hf(self, checkpoint: str, dest: Path) -> Mapping[str, Any]:
        """Optional (what a server engine, ``generation.engine = "server"``, loads). Write
        ``checkpoint`` as a new Hugging Face model folder ``dest`` (config, safetensors weights,
        tokenizer; a parameter-efficient checkpoint merged into its base), atomically; returns
        a JSON-serialisable summary (``model_type``, ``files``, ...)."""

    def check_export_hf(self) -> None:
        """Optional (with ``export_hf``). Raise ``UserError`` naming ``generation.engine`` when this
        model cannot be exported (its architecture, its tokenizer): asked before the run writes."""

    def adapter_base(self, checkpoint: str) -> str | None:
        """Optional (with ``export_adapter``). The base checkpoint whose weights
        ``checkpoint``'s adapters (a parameter-efficient stage's) are applied to; None when
        ``checkpoint`` is a whole model."""

    def export_adapter(self, checkpoint: str, dest: Path, base_name: str) -> Mapping[str, Any]:
        """Optional. Write the adapters of ``checkpoint`` (one ``adapter_base`` names a base
        of) alone as a new peft folder ``dest`` (``adapter_config.json`` naming
        ``base_name``, ``adapter_model.safetensors``), atomically; returns a summary."""

    def fit_prompt(self, prompt: str, spec: GenSpec) -> str:
        """Optional. ``prompt`` as ``generate`` would read it under ``spec``: left-truncated to
        ``prompt_capacity(spec)`` tokens (the text of the tokens kept); an engine sends this."""

    def train_preferences(self, init: str, out: Path, pairs: Sequence[PreferencePair], spec: PreferenceSpec,
                          progress: Progress | None = None) -> TrainResult:
        """Optional (with ``score``: a backend that trains verifiers, ``[verifier]``). Train a
        verifier by DPO (``PreferenceSpec``) from ``init`` on ``pairs``, the reference model
        ``init`` itself, frozen, and write it to ``out`` atomically, a checkpoint like
        ``train``'s (loadable by ``generate``, ``score``, ``checkpoint_id``; resumable mid-stage
        as ``train`` is). ``TrainResult.losses``: the DPO loss per optimizer step; ``tokens``:
        the completion tokens of the pairs the steps took. Same inputs give the same
        parameters."""

    def score(self, checkpoint: str, examples: Sequence[TrainExample], batch_size: int,
              progress: Progress | None = None) -> list[float]:
        """Optional (see ``train_preferences``). Per example, the log-probability that
        ``checkpoint`` gives its ``completion`` after its ``prompt``: summed over the
        completion's tokens and the end-of-text token the backend appends (the tokens
        ``train``'s loss covers), in fp32; ``batch_size`` sequences at a time. A prompt longer
        than the context keeps its end, as ``generate`` does."""


@runtime_checkable
class MultiProcess(Protocol):
    """What a backend that runs as several processes (one per host, e.g. multi-process
    JAX) adds to ``Backend``. Every process runs the whole loop; the core writes the run
    directory from process 0 and has all meet at a barrier after each change
    (``star_engine.rundir.procs``). A backend may also have ``abort(message: str) -> None``: a
    failing process calls it so that the others stop at their next barrier."""

    def process_index(self) -> int:
        """This process's index, in [0, process_count())."""

    def process_count(self) -> int:
        """How many processes run the loop (1: this protocol changes nothing)."""

    def barrier(self, name: str) -> None:
        """Return when every process has called it with ``name``; end with
        ``star_engine.errors.ProcessLost`` within a bounded time when another process
        failed (called ``abort``) or died."""
