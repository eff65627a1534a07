"""The ``haiku_xmap`` backend: GPT-J and the Llama family (dm-haiku) on a (dp, mp) mesh.

``HaikuXmapBackend`` is the façade the core builds (``star_engine.api.Backend``): jax-free,
so that discovery, ``--help`` and ``validate``'s option checks load no jax. Building it
reads the checkpoint's manifest and the tokenizer's file (``options.resolve``) and starts
nothing; its jax-using bodies are ``runtime/engine.py``'s, imported once (``engine``), when
a method first needs them. Checkpoints are native checkpoint directories
(``checkpoint/format.py``); a checkpoint's id is the sha256 of its manifest.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any
from collections.abc import Mapping, Sequence

from star_engine import (GenRequest, GenSpec, IntegrityError, PreferencePair, PreferenceSpec, Progress, TrainExample,
                         TrainResult, TrainSpec, UserError, hookimpl)

from .checkpoint.format import manifest_sha256
from .convert.commands import ConvertCommand, PlanCommand
from .model.lora_options import LoraOptions
from .options import BACKEND, AdamW, DecodeConfig, ModelOptions, TrainConfig, decode_config, resolve, train_config
from .runtime.hugepages import is_command, with_hugepages
from .runtime.layout import resolve_options

if TYPE_CHECKING:
    from .engine import Engine
    from .session.weights import Weights


class HaikuXmapBackend:
    """The ``[model]`` table is ``ModelOptions`` (``Options``: the core checks it before it
    builds the backend). Building reads the checkpoint's manifest and the tokenizer's file
    (``options.resolve``) and starts nothing; ``start`` is the runtime's start-up, which the
    run takes before it writes anything and ``star-engine validate`` never takes."""

    Options = ModelOptions
    optimizer_table = AdamW  # the [*.optimizer] tables: config.load_experiment checks and completes them
    adapter_kinds = ("lora",)  # [*.adapter] tables this backend trains (model/lora.py; checked in validate_run)
    adapter_tables = {"lora": LoraOptions}  # their declarations, by kind

    def __init__(self, options: ModelOptions) -> None:
        self.options = options
        self.model = resolve(options)
        self.config, self.tokenizer, self.seq_len = self.model
        self.checkpoint_path = options.checkpoint_path
        """The configured checkpoint (``model.checkpoint_path``), "" when the base is a random init."""
        self.process_layout = resolve_options(options.distributed)  # the layout, before jax starts
        self._engine: Engine | None = None

    @classmethod
    def from_table(cls, **table: Any) -> HaikuXmapBackend:
        """The backend of a ``[model]`` table (less ``backend``), checked as the core checks it."""
        return cls(ModelOptions.from_table(table))

    def engine(self) -> Engine:
        """The jax-using bodies (``engine.Engine``): the one import of jax's side, on first need."""
        if self._engine is None:
            from .engine import Engine  # jax: the backend is built and discovered without it

            self._engine = Engine(self.options, self.model, self.process_layout)
        return self._engine

    # ------------------------------------------------------------------ runtime

    def start(self) -> None:
        """The runtime's start-up (``Backend.start``; idempotent): the ``star-engine`` command
        first runs itself again with glibc's huge pages (``hugepages.with_hugepages``), then
        ``machine.start_runtime``: XLA:CPU devices, multi-process JAX and its heartbeat, the
        compilation cache, the mesh. A backend used without the core (tests, benchmarks)
        starts on first use, without the re-exec."""
        if not self.started and is_command():
            with_hugepages()
        self.runtime()

    def matmul_gflops(self) -> float:
        """fp32 matmul GFLOP/s through XLA here, now (``Backend.matmul_gflops``; ``runtime/speed.py``),
        the runtime started first so that the measurement runs on the run's devices and threads."""
        self.runtime()
        from .runtime.speed import matmul_gflops  # jax: on first need

        return matmul_gflops()

    @property
    def started(self) -> bool:
        return self._engine is not None and self._engine.started

    def runtime(self) -> Any:
        """The started runtime (``machine.Runtime``), starting it if need be."""
        return self.engine().runtime()

    @property
    def mesh(self) -> Any:
        return self.engine().mesh

    # ------------------------------------------------------------------ checkpoints

    @property
    def weights(self) -> Weights:
        """The weights on the mesh (``session.weights.Weights``: load, cache, save, keep written)."""
        return self.engine().weights

    def save_params(self, path: Path, params: Any, extra: dict, dtype: str | None = None, specs: Any = None) -> None:
        """``Weights.save``."""
        self.weights.save(path, params, extra, dtype, specs)

    def keep_written(self, out: Path, params: Any, extra: dict, *, dtype: str | None = None, specs: Any = None,
                     compute: Any = None) -> str:
        """``Weights.keep_written``."""
        return self.weights.keep_written(out, params, extra, dtype=dtype, specs=specs, compute=compute)

    def checkpoint_id(self, checkpoint: str) -> str:
        return manifest_sha256(checkpoint)

    def load_params(self, checkpoint: str, dtype: str | None = None, keep: bool = True) -> Any:
        """``Weights.load``."""
        return self.weights.load(checkpoint, dtype, keep)

    def base(self, workdir: Path, seed: int) -> str:
        return self.engine().base(workdir, seed)

    # ------------------------------------------------------------------ train

    def train_config(self, spec: TrainSpec, adapter: Any = None) -> TrainConfig:
        """The ``options.TrainConfig`` of ``spec`` under this backend's options (``adapter``: a
        LoRA stage's ``lora.LoraSpec``); ``spec.optimizer`` an ``AdamW`` or a table."""
        return train_config(self.options, self.model, spec, adapter)

    def train(self, init: str, out: Path, examples: Sequence[TrainExample], spec: TrainSpec,
              progress: Progress | None = None) -> TrainResult:
        """Fine-tune (``spec.packing``, ``spec.loss``: ``train/packing.py``; with ``spec.adapter``
        LoRA adapters, ``train/lora_stage.py``). The checkpoint stores the master weights (as its
        model dtype; ``extra.compute_dtype``): a run continuing from it starts from exactly them,
        generation casts them. Its training snapshot stays until the run has recorded it
        (``checkpoint_recorded``)."""
        return self.engine().train(init, out, examples, spec, progress)

    def train_preferences(self, init: str, out: Path, pairs: Sequence[PreferencePair], spec: PreferenceSpec,
                          progress: Progress | None = None) -> TrainResult:
        """Train a verifier by DPO from ``init``, its frozen reference (``train/preference.py``): a
        checkpoint like ``train``'s (``extra.stage = "verifier"``), resumable mid-stage."""
        return self.engine().train_preferences(init, out, pairs, spec, progress)

    def score(self, checkpoint: str, examples: Sequence[TrainExample], batch_size: int,
              progress: Progress | None = None) -> list[float]:
        """Per example, fp32 log p(completion + end-of-text | prompt) under ``checkpoint``
        (``preference.score``): what DPO's policy term computes for the same text."""
        return self.engine().score(checkpoint, examples, batch_size, progress)

    def checkpoint_recorded(self, checkpoint: str) -> None:
        """The run has recorded the stage that wrote ``checkpoint`` (``Backend.checkpoint_recorded``):
        its training snapshot (``train/resume.py``), kept until now so that a kill between the
        checkpoint's write and the run's record of it retrains from the snapshot, is deleted."""
        self.engine().checkpoint_recorded(checkpoint)

    # ------------------------------------------------------------------ generate

    def generate(self, checkpoint: str, requests: Sequence[GenRequest], spec: GenSpec,
                 progress: Progress | None = None) -> list[str]:
        """One completion per request (``sampling.text.generate_text``; ``spec`` as ``validate_run``
        accepted it: its context checked against the model)."""
        if not requests:
            return []
        if spec.max_new_tokens == 0:
            if progress is not None:
                progress(len(requests))
            return [""] * len(requests)
        return self.engine().generate(checkpoint, requests, spec, progress)

    def fit_prompt(self, prompt: str, spec: GenSpec) -> str:
        """``prompt`` as ``generate`` reads it (``Backend.fit_prompt``): its last
        ``prompt_capacity(spec)`` tokens, as text (a cut inside a character's bytes decodes as
        U+FFFD, which the server then encodes as that character)."""
        ids, keep = self.tokenizer.encode(prompt), self.prompt_capacity(spec)
        return prompt if len(ids) <= keep else self.tokenizer.decode(ids[len(ids) - keep:])

    # ------------------------------------------------------------------ export (a server engine's)

    def export_hf(self, checkpoint: str, dest: Path) -> Mapping[str, Any]:
        """``checkpoint`` as a new Hugging Face folder ``dest`` (``Backend.export_hf``;
        ``convert.hf_export.export_hf``: a LoRA checkpoint merged into its base)."""
        from .convert.hf_export import export_hf

        return export_hf(checkpoint, dest)

    def check_export_hf(self) -> None:
        """Whether ``export_hf`` can write this model for a server (``Backend.check_export_hf``):
        its architecture has a Hugging Face export and its tokenizer a ``tokenizer.json``."""
        from .convert.hf_export import KNOWN, tokenizer_files
        from .model.config import architecture

        arch = architecture(self.config)
        if arch not in KNOWN:
            raise UserError(f"generation.engine: the model's architecture {arch!r} has no Hugging Face export for a "
                            f"server to load (known: {', '.join(KNOWN)})", key="generation.engine")
        try:
            tokenizer_files(self.tokenizer.to_dict(), self.config, "model.tokenizer")
        except (UserError, IntegrityError) as e:
            raise UserError(f"generation.engine: the model's tokenizer cannot be exported for a server: {e}",
                            key="generation.engine") from None

    def adapter_base(self, checkpoint: str) -> str | None:
        """The base a LoRA checkpoint's adapters are over (``Backend.adapter_base``); None for a
        whole model."""
        from .convert.peft_export import lora_base

        return lora_base(checkpoint)

    def export_adapter(self, checkpoint: str, dest: Path, base_name: str) -> Mapping[str, Any]:
        """A LoRA checkpoint's adapters as a peft folder (``convert.peft_export.export_peft``)."""
        from .convert.peft_export import export_peft

        return export_peft(checkpoint, dest, base_name=base_name)

    def decode_config(self, spec: GenSpec) -> DecodeConfig:
        """The ``options.DecodeConfig`` of ``spec`` under this backend's options and tokenizer."""
        return decode_config(self.options, self.tokenizer, spec)

    # ------------------------------------------------------------------ processes
    # Multi-process JAX: the core writes the run directory from process 0 and
    # waits at these barriers (star_engine.rundir.procs). The layout is the configured one
    # (``model.distributed``) until the runtime starts; "auto" asks JAX, which starts it.

    def _layout(self) -> tuple[int, int]:
        """(this process's index, the number of processes)."""
        if not self.started and self.process_layout is None:
            return 0, 1
        if not self.started and self.process_layout is not None and not self.process_layout.get("auto"):
            return int(self.process_layout["process_id"]), int(self.process_layout["num_processes"])
        return self.engine().layout()

    def process_index(self) -> int:
        return self._layout()[0]

    def process_count(self) -> int:
        return self._layout()[1]

    def barrier(self, name: str) -> None:
        """All processes meet (``coordination.barrier``): ends with ``ProcessLost`` when another
        process failed (``abort``) or died, instead of waiting for it."""
        self.engine().barrier(name)

    def abort(self, message: str) -> None:
        """This process is stopping: the others leave their barriers with ``message``
        (nothing to tell before the runtime has started)."""
        if self.started:
            self.engine().abort(message)

    def validate_run(self, generation: Mapping[str, GenSpec], training: Mapping[str, TrainSpec]) -> None:
        """The backend's checks of a run before it starts (``Backend.validate_run``;
        ``preflight.validate_run``): what depends on the model, and the checkpoint's files."""
        self.engine().validate_run(generation, training)

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Tokens of each text in this backend's tokenizer (the run's per-question ledger)."""
        return [len(self.tokenizer.encode(t)) for t in texts]

    def prompt_capacity(self, spec: GenSpec) -> int:
        """The prompt tokens ``generate`` keeps (``Backend.prompt_capacity``): the context less
        the new tokens; a longer prompt keeps its end (``text.generate_text``)."""
        return max(0, self.config.n_ctx - spec.max_new_tokens)

    def describe(self) -> Mapping[str, Any]:
        return self.engine().describe()


@hookimpl
def register_backends(register) -> None:
    register(BACKEND, HaikuXmapBackend)


@hookimpl
def register_commands(register) -> None:
    register("convert", ConvertCommand)
    register("plan", PlanCommand)
