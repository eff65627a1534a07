"""The ``haiku_xmap`` backend: GPT-J (dm-haiku) on a (dp, mp) mesh.

Checkpoints are native checkpoint directories (``checkpoint/format.py``); a
checkpoint's id is the sha256 of its manifest. jax is imported when a backend
is built, not when the plugin is discovered.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from collections.abc import Mapping, Sequence

from star_engine import (GenRequest, GenSpec, PreferencePair, PreferenceSpec, Progress, TrainExample, TrainResult,
                         TrainSpec, UserError, hookimpl)

from .options import AdamW, DecodeConfig, ModelOptions, TrainConfig, resolve
from .sampling.text import generate_text

BACKEND = "haiku_xmap"
BASE_DIR = "base_init"


class HaikuXmapBackend:
    """The ``[model]`` table is ``ModelOptions`` (``Options``: the core checks it before it
    builds the backend). Building reads the checkpoint's manifest and the tokenizer's file
    (``options.resolve``) and starts nothing; ``start`` is the runtime's start-up, which the
    run takes before it writes anything and ``star-engine validate`` never takes."""

    Options = ModelOptions
    optimizer_table = AdamW  # the [*.optimizer] tables: config.load_experiment checks and completes them
    adapter_kinds = ("lora",)  # [*.adapter] tables this backend trains (lora.py; checked in validate_run)

    def __init__(self, options: ModelOptions) -> None:
        from .distributed import resolve_options

        self.options = options
        self.config, self.tokenizer, self.seq_len = resolve(options)
        self.checkpoint_path = options.checkpoint_path
        """The configured checkpoint (``model.checkpoint_path``), "" when the base is a random init."""
        self.process_layout = resolve_options(options.distributed)  # the layout, before jax starts
        self._runtime: Any = None  # machine.Runtime, once started
        self._cache: tuple[tuple[str, str], str, Any] | None = None  # ((path, checkpoint id), dtype, params)

    @classmethod
    def from_table(cls, **table: Any) -> HaikuXmapBackend:
        """The backend of a ``[model]`` table (less ``backend``), checked as the core checks it."""
        return cls(ModelOptions.from_table(table))

    # ------------------------------------------------------------------ runtime

    def start(self) -> None:
        """The runtime's start-up (``Backend.start``; idempotent): the ``star-engine`` command
        first runs itself again with glibc's huge pages (``machine.with_hugepages``), then
        ``machine.start_runtime``: XLA:CPU devices, multi-process JAX and its heartbeat, the
        compilation cache, the mesh. A backend used without the core (tests, benchmarks)
        starts on first use, without the re-exec."""
        from .machine import is_command, with_hugepages

        if self._runtime is None and is_command():
            with_hugepages()
        self.runtime()

    def runtime(self) -> Any:
        """The started runtime (``machine.Runtime``), starting it if need be."""
        if self._runtime is None:
            from .machine import start_runtime

            self._runtime = start_runtime(self.options)
        return self._runtime

    @property
    def mesh(self) -> Any:
        return self.runtime().mesh

    # ------------------------------------------------------------------ checkpoints

    def save_params(self, path: Path, params: Any, extra: dict, dtype: str | None = None, specs: Any = None) -> None:
        """Write ``params``; ``dtype``: the stored dtype when it is not the compute
        dtype (fp32 master weights), recorded as the checkpoint's model dtype; ``specs``:
        the leaves expected when they are not the model's (LoRA adapters)."""
        from .distributed import save_checkpoint

        config = self.config if dtype is None else self.config.replace(dtype=dtype)
        # On an mp > 1 mesh the mp-sharded leaves are stored as mp parts, so that a
        # later load reads only each device's slice (checkpoint/format.py, version 2).
        save_checkpoint(path, params, model_config=config.to_dict(), tokenizer=self.tokenizer.to_dict(),
                        extra=extra, mp_split=int(self.mesh.shape["mp"]), specs=specs)

    def keep_written(self, out: Path, params: Any, extra: dict, *, dtype: str | None = None, specs: Any = None,
                      compute: Any = None) -> str:
        """Write a stage's checkpoint ``out`` of ``params`` (``_save``'s arguments) and keep its
        weights on the devices for the generation or scoring that follows, in the compute dtype:
        ``compute`` when the caller has them so (merged LoRA adapters), else ``params`` cast,
        laid out by the rule table (ZeRO-1 returns fp32 masters split over dp). Returns its id."""
        import jax
        import jax.numpy as jnp

        from . import sharding

        self.save_params(out, params, extra, dtype=dtype, specs=specs)
        ckpt_id = self.checkpoint_id(str(out))
        if compute is None:
            cast = jax.jit(lambda p: jax.tree.map(lambda x: x.astype(jnp.dtype(self.config.dtype)), p),
                           out_shardings=sharding.tree_shardings(params, self.mesh))
            compute = cast(params)
        self._cache = ((str(out.resolve()), ckpt_id), self.config.dtype, compute)
        return ckpt_id

    def checkpoint_id(self, checkpoint: str) -> str:
        from .checkpoint.format import manifest_sha256

        return manifest_sha256(checkpoint)

    def load_params(self, checkpoint: str, dtype: str | None = None, keep: bool = True) -> Any:
        """Params of ``checkpoint`` on the mesh, cast to ``dtype`` (default: the compute
        dtype). The last one loaded is cached (``keep``) in its dtype; the cache also
        serves another dtype when it holds the stored values (the cast is then exact)."""
        import jax
        import jax.numpy as jnp

        from . import model, sharding
        from .checkpoint.format import load_checkpoint, read_manifest
        from .config import config_from_dict

        dtype = dtype or self.config.dtype
        key = (str(Path(checkpoint).resolve()), self.checkpoint_id(checkpoint))
        manifest = read_manifest(checkpoint)
        adapters = manifest["extra"].get("kind") == "lora"  # adapters alone, merged into their base
        stored = config_from_dict(manifest["model_config"])
        cache, self._cache = self._cache, (self._cache if keep else None)
        exact = (dtype,) if adapters else (dtype, stored.dtype)  # a merged model is cached in its dtype only
        if cache is not None and cache[0] == key and cache[1] in exact:
            return jax.tree.map(lambda p: p.astype(jnp.dtype(dtype)), cache[2])
        del cache
        self._cache = None  # one model on the devices at a time
        if adapters:
            from .lora_stage import load_merged

            merged = load_merged(self, checkpoint, manifest, dtype)
            self._cache = (key, dtype, merged) if keep else None
            return merged
        if stored.replace(dtype=self.config.dtype) != self.config:
            raise UserError(f"{checkpoint}: its model config {stored.to_dict()} is not this backend's "
                            f"{self.config.to_dict()}")
        shapes = model.param_shapes(stored)
        params, _ = load_checkpoint(checkpoint, shardings=sharding.tree_shardings(shapes, self.mesh))
        params = jax.tree.map(lambda p: p.astype(jnp.dtype(dtype)), params)
        if keep:
            self._cache = (key, dtype, params)
        return params

    def base(self, workdir: Path, seed: int) -> str:
        from . import model
        from .checkpoint.format import read_manifest
        from .sampling.static import keys_from_seeds

        if self.checkpoint_path:
            return self.checkpoint_path
        out = Path(workdir) / BASE_DIR
        extra = {"kind": "random_init", "seed": int(seed)}
        self.barrier(f"base {out}")  # several processes decide on the same files
        if (out / "manifest.msgpack").is_file():
            m = read_manifest(out)
            if m["model_config"] == self.config.to_dict() and m["extra"] == extra:
                return str(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        params = model.init_params(self.config, keys_from_seeds([seed])[0])
        self.save_params(out, params, extra)
        return str(out)

    # ------------------------------------------------------------------ train

    def train_config(self, spec: TrainSpec, adapter: Any = None) -> TrainConfig:
        """The ``options.TrainConfig`` of ``spec`` under this backend's options (``adapter``: a
        LoRA stage's ``lora.LoraSpec``)."""
        o = self.options
        return TrainConfig(steps=spec.steps, batch_size=spec.batch_size, grad_accum=spec.grad_accum,
                           seed=spec.seed, optimizer=AdamW.from_table(spec.optimizer), seq_len=self.seq_len,
                           pad_id=self.tokenizer.pad_id, packing=spec.packing, loss=spec.loss, zero=o.zero,
                           opt_state_dtype=o.opt_state_dtype, master_dtype=o.master_dtype,
                           accum_dtype=o.grad_accum_dtype, remat=o.remat, adapter=adapter)

    def train(self, init: str, out: Path, examples: Sequence[TrainExample], spec: TrainSpec,
              progress: Progress | None = None) -> TrainResult:
        """Fine-tune (``spec.packing``, ``spec.loss``: ``packing.py``). The checkpoint
        stores the master weights (as its model dtype; ``extra.compute_dtype``): a
        run continuing from it starts from exactly them, generation casts them. Its
        training snapshot stays until the run has recorded it (``checkpoint_recorded``)."""
        import jax

        from . import packing as pk
        from . import train as tr
        from .resume import stage_snapshots

        limit = None if spec.packing == "stream" else self.seq_len  # a stream example may span chunks
        encoded = []
        for i, ex in enumerate(examples):
            try:
                encoded.append(tr.encode_example(self.tokenizer, ex.prompt, ex.completion, limit))
            except ValueError as exc:
                raise UserError(f"training example {i}: {exc}") from None
        if spec.steps > 0 and not encoded:
            raise UserError(f"training: {spec.steps} steps requested but there are no training examples",
                            key="training")
        if spec.adapter is not None:
            from .lora_stage import train_adapters

            return train_adapters(self, init, Path(out), encoded, spec, progress)
        snapshots = stage_snapshots(self, init, out, spec, encoded)
        try:
            # No local reference to the loaded weights: the trainer's master copy replaces them.
            params, losses, tokens = tr.train(self.load_params(init, self.options.master_dtype, keep=False), self.config,
                                              encoded, self.train_config(spec), mesh=self.mesh, progress=progress,
                                              snapshots=snapshots)
        except pk.PackingError as exc:
            raise UserError(f"training.packing: {exc}", key="training.packing") from None
        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        stored = str(jax.tree.leaves(params)[0].dtype)
        ckpt_id = self.keep_written(out, params, {"kind": "finetune", "init": self.checkpoint_id(init),
                                                   "steps": spec.steps, "seed": spec.seed, "examples": len(encoded),
                                                   "packing": spec.packing, "loss": spec.loss,
                                                   "compute_dtype": self.config.dtype}, dtype=stored)
        return TrainResult(checkpoint=str(out), checkpoint_id=ckpt_id, steps=spec.steps, tokens=tokens,
                           losses=tuple(losses))

    def train_preferences(self, init: str, out: Path, pairs: Sequence[PreferencePair], spec: PreferenceSpec,
                          progress: Progress | None = None) -> TrainResult:
        """Train a verifier by DPO from ``init``, its frozen reference (``preference.py``): a
        checkpoint like ``train``'s (``extra.stage = "verifier"``), resumable mid-stage."""
        from .preference import train_preferences

        return train_preferences(self, init, Path(out), pairs, spec, progress)

    def score(self, checkpoint: str, examples: Sequence[TrainExample], batch_size: int,
              progress: Progress | None = None) -> list[float]:
        """Per example, fp32 log p(completion + end-of-text | prompt) under ``checkpoint``
        (``preference.score``): what DPO's policy term computes for the same text."""
        from .preference import score

        return score(self, checkpoint, examples, batch_size, progress)

    def checkpoint_recorded(self, checkpoint: str) -> None:
        """The run has recorded the stage that wrote ``checkpoint`` (``Backend.checkpoint_recorded``):
        its training snapshot (``resume.py``), kept until now so that a kill between the
        checkpoint's write and the run's record of it retrains from the snapshot, is deleted."""
        from .resume import release

        self.runtime()
        release(checkpoint)

    # ------------------------------------------------------------------ generate

    def generate(self, checkpoint: str, requests: Sequence[GenRequest], spec: GenSpec,
                 progress: Progress | None = None) -> list[str]:
        """One completion per request (``text.generate_text``; ``spec`` as ``validate_run``
        accepted it: its context checked against the model)."""
        if not requests:
            return []
        if spec.max_new_tokens == 0:
            if progress is not None:
                progress(len(requests))
            return [""] * len(requests)
        from .preflight import check_generation

        check_generation("generation", spec, self.config.n_ctx)  # a caller that skipped validate_run
        return generate_text(self.load_params(checkpoint), requests, spec, tokenizer=self.tokenizer, config=self.config,
                             mesh=self.mesh, decode=self.decode_config(spec),
                             continuous=self.options.generation == "continuous", progress=progress)

    def decode_config(self, spec: GenSpec) -> DecodeConfig:
        """The ``options.DecodeConfig`` of ``spec`` under this backend's options and tokenizer."""
        o, tok = self.options, self.tokenizer
        return DecodeConfig(temperature=float(spec.temperature), top_p=float(spec.top_p), eos_id=tok.eos_id,
                            pad_id=tok.pad_id, valid_vocab=tok.vocab_size, slots=spec.batch_size,
                            chunk=o.generation_chunk, share_prefix=o.share_prefix,
                            max_new_tokens=spec.max_new_tokens)

    # ------------------------------------------------------------------ processes
    # Multi-process JAX: the core writes the run directory from process 0 and
    # waits at these barriers (star_engine.rundir.procs). The layout is the configured one
    # (``model.distributed``) until the runtime starts; "auto" asks JAX, which starts it.

    def _layout(self) -> tuple[int, int]:
        """(this process's index, the number of processes)."""
        if self._runtime is None and self.process_layout is None:
            return 0, 1
        if self._runtime is None and self.process_layout is not None and not self.process_layout.get("auto"):
            return int(self.process_layout["process_id"]), int(self.process_layout["num_processes"])
        import jax

        self.runtime()
        return jax.process_index(), jax.process_count()

    def process_index(self) -> int:
        return self._layout()[0]

    def process_count(self) -> int:
        return self._layout()[1]

    def barrier(self, name: str) -> None:
        """All processes meet (``coordination.barrier``): ends with ``ProcessLost`` when another
        process failed (``abort``) or died, instead of waiting for it."""
        from . import coordination

        self.runtime()
        coordination.barrier(name)

    def abort(self, message: str) -> None:
        """This process is stopping: the others leave their barriers with ``message``
        (nothing to tell before the runtime has started)."""
        from . import coordination

        if self._runtime is not None:
            coordination.abort(message)

    def validate_run(self, generation: Mapping[str, GenSpec], training: Mapping[str, TrainSpec]) -> None:
        """The backend's checks of a run before it starts (``Backend.validate_run``;
        ``preflight.validate_run``): what depends on the model, and the checkpoint's files."""
        from .preflight import validate_run

        validate_run(self, generation, training)

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Tokens of each text in this backend's tokenizer (the run's per-question ledger)."""
        return [len(self.tokenizer.encode(t)) for t in texts]

    def prompt_capacity(self, spec: GenSpec) -> int:
        """The prompt tokens ``generate`` keeps (``Backend.prompt_capacity``): the context less
        the new tokens; a longer prompt keeps its end (``text.generate_text``)."""
        return max(0, self.config.n_ctx - spec.max_new_tokens)

    def describe(self) -> Mapping[str, Any]:
        from .model import param_count

        o, mesh = self.options, self.mesh
        return {"backend": BACKEND, "model": self.config.to_dict(), "param_count": param_count(self.config),
                "tokenizer": {k: v for k, v in self.tokenizer.to_dict().items() if k != "json"},
                "checkpoint_path": self.checkpoint_path, "seq_len": self.seq_len,
                "mesh": {"dp": int(mesh.shape["dp"]), "mp": int(mesh.shape["mp"])},
                "zero": o.zero, "opt_state_dtype": o.opt_state_dtype, "master_dtype": o.master_dtype,
                "grad_accum_dtype": o.grad_accum_dtype, "remat": o.remat, "generation": o.generation,
                "train_checkpoint_steps": o.train_checkpoint_steps,
                "train_checkpoint_minutes": o.train_checkpoint_minutes,
                "processes": self.process_count(),
                "devices": [str(d) for d in mesh.devices.flat]}


@hookimpl
def register_backends(register) -> None:
    register(BACKEND, HaikuXmapBackend)


@hookimpl
def register_commands(register) -> None:
    from .convert.commands import ConvertCommand, PlanCommand

    register("convert", ConvertCommand)
    register("plan", PlanCommand)
