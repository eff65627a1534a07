"""The ``haiku_xmap`` backend: GPT-J (dm-haiku) on a (dp, mp) mesh.

Checkpoints are native checkpoint directories (``convert/checkpoint.py``); a
checkpoint's id is the sha256 of its manifest. jax is imported when a backend
is built, not when the plugin is discovered.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from collections.abc import Mapping, Sequence

from star_engine import hookimpl
from star_engine.api import GenRequest, GenSpec, Progress, TrainExample, TrainResult, TrainSpec
from star_engine.errors import UserError
from star_engine.options import is_int

from .config import PRESETS, architecture as arch_of, config_from_dict
from .machine import set_cpu_devices, use_compile_cache, use_every_core
from .options import AdamW, check_run_options
from .sampling.text import generate_text

BACKEND = "haiku_xmap"
BASE_DIR = "base_init"


def _config_error(exc: Exception) -> str:
    """A config refusal as the ``[model]`` key it is about: ``model.n_layer: must be ...``."""
    m = re.match(r"(?:GPTJ|Llama)Config\.(\w+) (.*)$", str(exc), re.DOTALL)
    if m:
        return f"model.{m.group(1)}: {m.group(2)}"
    m = re.search(r"unexpected keyword argument '(\w+)'", str(exc))
    return f"model.{m.group(1)}: not an option of this architecture" if m else f"model: {exc}"


class HaikuXmapBackend:
    """``[model]`` options: ``architecture`` ("gptj" or "llama"; default: the
    checkpoint's, else the preset's), a preset (default "tiny", or "llama-tiny"
    for architecture "llama"; docs/models.md) with field overrides (ignored when
    ``checkpoint_path`` is set: the checkpoint carries its config, and an override
    that disagrees with it is an error), the tokenizer, the mesh and the maximum
    training length ``seq_len`` (default n_ctx); ``zero = 1`` partitions the
    optimizer state over "dp" (ZeRO-1), ``opt_state_dtype`` stores it in fp32 or
    bf16, ``master_dtype`` is the dtype of the trained weights (fp32 masters under
    bf16 compute by default; fine-tuned checkpoints store them), ``grad_accum_dtype``
    the gradient accumulator's, ``remat`` recomputes each block in the backward
    pass instead of keeping its activations, ``distributed`` starts multi-process JAX and
    ``cpu_devices`` sets how many XLA:CPU devices (cores) the mesh spans
    (``machine.py``; default: one per core, ``use_every_core``). ``generation``: "continuous" (default: a slot whose row
    has ended takes the next prompt, ``continuous.py``) or "static" (length-sorted
    batches, each until its last row ends); ``generation_chunk``: decode steps
    between the host's stop-string checks and refills; ``share_prefix``: the
    tokens every prompt of a generation call starts with (a few-shot prompt) are
    prefilled once (continuous generation; ``continuous.shared_prefix``). ``train_checkpoint_steps`` /
    ``train_checkpoint_minutes``: how often a fine-tuning stage snapshots its whole
    training state so that a killed run resumes mid-stage (``resume.py``; 0 = off;
    default: every 10 minutes, 30 for models of 1B parameters or more)."""

    optimizer_table = AdamW  # the [*.optimizer] tables: config.load_experiment checks and completes them
    adapter_kinds = ("lora",)  # [*.adapter] tables this backend trains (lora.py; checked in validate_run)

    def __init__(self, preset: str | None = None, dtype: str | None = None, n_layer: int | None = None,
                 d_model: int | None = None, n_head: int | None = None, d_head: int | None = None,
                 d_ff: int | None = None, rotary_dim: int | None = None, n_ctx: int | None = None,
                 n_kv_head: int | None = None, architecture: str | None = None,
                 vocab: int | None = None, tokenizer: str = "byte", tokenizer_file: str = "",
                 checkpoint_path: str = "", mesh: Mapping[str, Any] | None = None,
                 seq_len: int | None = None, zero: int = 0, opt_state_dtype: str = "float32",
                 master_dtype: str = "float32", grad_accum_dtype: str = "float32", remat: bool = False,
                 distributed: Mapping[str, Any] | str | None = None, cpu_devices: int | None = None,
                 generation: str = "continuous", generation_chunk: int = 16, share_prefix: bool = True,
                 train_checkpoint_steps: int = 0, train_checkpoint_minutes: float | None = None) -> None:
        from . import distributed as dist
        from . import resume

        check_run_options(generation=generation, generation_chunk=generation_chunk, share_prefix=share_prefix,
                          zero=zero, opt_state_dtype=opt_state_dtype, remat=remat, dtype=dtype,
                          architecture=architecture)
        self.generation, self.generation_chunk, self.share_prefix = generation, generation_chunk, share_prefix
        resume.check_options(train_checkpoint_steps,
                             0 if train_checkpoint_minutes is None else train_checkpoint_minutes)
        self.train_checkpoint_steps, self._train_checkpoint_minutes = train_checkpoint_steps, train_checkpoint_minutes

        # Before anything starts jax's backends (make_mesh below lists the devices).
        if cpu_devices is not None:
            set_cpu_devices(cpu_devices)
        elif dist.resolve_options(distributed) is None:
            use_every_core(mesh)
        self._distributed = dist.initialize(distributed)
        use_compile_cache()
        if self._distributed:  # the other processes' barriers see this one alive from now on
            from .coordination import start_heartbeat

            start_heartbeat()
        self.zero, self.opt_state_dtype = zero, opt_state_dtype
        self.master_dtype, self.grad_accum_dtype = master_dtype, grad_accum_dtype
        self.remat = remat

        from . import sharding
        from .checkpoint.format import read_manifest
        from .tokenizer import ByteTokenizer, HFTokenizer, tokenizer_from_dict

        overrides = dict(n_layer=n_layer, d_model=d_model, n_head=n_head, d_head=d_head, d_ff=d_ff,
                         rotary_dim=rotary_dim, n_ctx=n_ctx, vocab=vocab, n_kv_head=n_kv_head)
        self._checkpoint_path = str(checkpoint_path) if checkpoint_path else ""
        stored_tok = None
        if self._checkpoint_path:
            manifest = read_manifest(self._checkpoint_path)
            base = config_from_dict(manifest["model_config"])
            if architecture is not None and architecture != arch_of(base):
                raise UserError(f"model.architecture: {architecture!r} disagrees with the checkpoint's "
                                f"{arch_of(base)!r} ({self._checkpoint_path})")
            for key, value in overrides.items():
                if value is not None and value != getattr(base, key, None):
                    raise UserError(f"model.{key}: {value} disagrees with the checkpoint's {getattr(base, key)} "
                                    f"({self._checkpoint_path})")
            stored_tok = manifest["tokenizer"]
            self._ckpt_dtype = base.dtype
        else:
            if preset is None:
                preset = "llama-tiny" if architecture == "llama" else "tiny"
            if preset not in PRESETS:
                raise UserError(f"model.preset: unknown preset {preset!r}; known: {sorted(PRESETS)}")
            base = PRESETS[preset]
            if architecture is not None and architecture != arch_of(base):
                raise UserError(f"model.architecture: {architecture!r} disagrees with preset {preset!r} "
                                f"({arch_of(base)!r})")
            self._ckpt_dtype = None
        try:
            self.config = base.replace(**{k: v for k, v in overrides.items() if v is not None},
                                       **({"dtype": dtype} if dtype else {}))
        except (TypeError, ValueError) as exc:
            raise UserError(_config_error(exc)) from None

        if tokenizer not in ("byte", "hf"):
            raise UserError(f"model.tokenizer: must be 'byte' or 'hf', got {tokenizer!r}")
        if tokenizer_file:
            self.tokenizer = HFTokenizer(tokenizer_file)
        elif stored_tok is not None:
            self.tokenizer = tokenizer_from_dict(stored_tok)
        elif tokenizer == "hf":
            raise UserError("model.tokenizer_file: required when model.tokenizer = 'hf'")
        else:
            self.tokenizer = ByteTokenizer()
        from . import train as tr

        try:
            tr.check_dtypes(self.config, master_dtype, grad_accum_dtype)
        except ValueError as exc:
            key = "grad_accum_dtype" if "grad_accum_dtype" in str(exc) else "master_dtype"
            raise UserError(f"model.{key}: {exc}") from None
        if self.tokenizer.vocab_size > self.config.vocab:
            raise UserError(f"model.vocab: {self.config.vocab} is smaller than the tokenizer's "
                            f"{self.tokenizer.vocab_size} tokens")

        self.seq_len = self.config.n_ctx if seq_len is None else seq_len
        n = self.seq_len
        if not is_int(n) or not 2 <= n <= self.config.n_ctx:
            raise UserError(f"model.seq_len: must be an int in [2, n_ctx={self.config.n_ctx}], got {seq_len!r}")
        if mesh is not None and not isinstance(mesh, Mapping):
            raise UserError(f"model.mesh: must be a table like {{dp = -1, mp = 1}}, got {mesh!r}")
        self._mesh_cfg = {"dp": -1, "mp": 1} if mesh is None else dict(mesh)
        try:
            self.mesh = sharding.make_mesh(self._mesh_cfg)
        except ValueError as exc:
            raise UserError(f"model.mesh: {exc}") from None
        self._cache: tuple[tuple[str, str], str, Any] | None = None  # ((path, checkpoint id), dtype, params)

    # ------------------------------------------------------------------ checkpoints

    def _save(self, path: Path, params: Any, extra: dict, dtype: str | None = None, specs: Any = None) -> None:
        """Write ``params``; ``dtype``: the stored dtype when it is not the compute
        dtype (fp32 master weights), recorded as the checkpoint's model dtype; ``specs``:
        the leaves expected when they are not the model's (LoRA adapters)."""
        from .distributed import save_checkpoint

        config = self.config if dtype is None else self.config.replace(dtype=dtype)
        # On an mp > 1 mesh the mp-sharded leaves are stored as mp parts, so that a
        # later load reads only each device's slice (convert/checkpoint.py, version 2).
        save_checkpoint(path, params, model_config=config.to_dict(), tokenizer=self.tokenizer.to_dict(),
                        extra=extra, mp_split=int(self.mesh.shape["mp"]), specs=specs)

    def checkpoint_id(self, checkpoint: str) -> str:
        from .checkpoint.format import manifest_sha256

        return manifest_sha256(checkpoint)

    def _load(self, checkpoint: str, dtype: str | None = None, keep: bool = True) -> Any:
        """Params of ``checkpoint`` on the mesh, cast to ``dtype`` (default: the compute
        dtype). The last one loaded is cached (``keep``) in its dtype; the cache also
        serves another dtype when it holds the stored values (the cast is then exact)."""
        import jax
        import jax.numpy as jnp

        from . import model, sharding
        from .checkpoint.format import load_checkpoint, read_manifest
        from .resume import release

        release(checkpoint)  # loaded: the run has recorded the stage that wrote it
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
        shapes = jax.eval_shape(lambda k: model.init_params(stored, k), jax.random.key(0))
        params, _ = load_checkpoint(checkpoint, shardings=sharding.tree_shardings(shapes, self.mesh))
        params = jax.tree.map(lambda p: p.astype(jnp.dtype(dtype)), params)
        if keep:
            self._cache = (key, dtype, params)
        return params

    def base(self, workdir: Path, seed: int) -> str:
        from . import model
        from .checkpoint.format import read_manifest
        from .sampling.static import keys_from_seeds

        if self._checkpoint_path:
            return self._checkpoint_path
        out = Path(workdir) / BASE_DIR
        extra = {"kind": "random_init", "seed": int(seed)}
        from . import distributed as dist

        dist.barrier(f"base {out}")  # several processes decide on the same files
        if (out / "manifest.msgpack").is_file():
            m = read_manifest(out)
            if m["model_config"] == self.config.to_dict() and m["extra"] == extra:
                return str(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        params = model.init_params(self.config, keys_from_seeds([seed])[0])
        self._save(out, params, extra)
        return str(out)

    # ------------------------------------------------------------------ train

    def train(self, init: str, out: Path, examples: Sequence[TrainExample], spec: TrainSpec,
              progress: Progress | None = None) -> TrainResult:
        """Fine-tune (``spec.packing``, ``spec.loss``: ``packing.py``). The checkpoint
        stores the master weights (as its model dtype; ``extra.compute_dtype``): a
        run continuing from it starts from exactly them, generation casts them."""
        import jax
        import jax.numpy as jnp

        from . import packing as pk
        from . import sharding
        from . import train as tr

        for name in ("steps", "batch_size", "grad_accum"):
            value = getattr(spec, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < (0 if name == "steps" else 1):
                raise UserError(f"training.{name}: must be an int >= {0 if name == 'steps' else 1}, got {value!r}")
        packing, loss = spec.packing, spec.loss
        try:
            pk.check_options(packing, loss)
        except ValueError as exc:
            raise UserError(f"training.{exc}") from None
        limit = None if packing == "stream" else self.seq_len  # a stream example may span chunks
        encoded = []
        for i, ex in enumerate(examples):
            try:
                encoded.append(tr.encode_example(self.tokenizer, ex.prompt, ex.completion, limit))
            except ValueError as exc:
                raise UserError(f"training example {i}: {exc}") from None
        if spec.steps > 0 and not encoded:
            raise UserError(f"training: {spec.steps} steps requested but there are no training examples")
        from .resume import stage_snapshots

        if spec.adapter is not None:
            from .lora_stage import train_adapters

            return train_adapters(self, init, Path(out), encoded, spec, progress)
        snapshots = stage_snapshots(self, init, out, spec, encoded, self._train_checkpoint_minutes)
        try:
            # No local reference to the loaded weights: the trainer's master copy replaces them.
            params, losses, tokens = tr.train(
                self._load(init, self.master_dtype, keep=False), self.config, encoded, steps=spec.steps,
                batch_size=spec.batch_size, grad_accum=spec.grad_accum, seed=spec.seed, optimizer=spec.optimizer,
                seq_len=self.seq_len, pad_id=self.tokenizer.pad_id, mesh=self.mesh, zero=self.zero,
                opt_state_dtype=self.opt_state_dtype, progress=progress,
                packing=packing, loss=loss, master_dtype=self.master_dtype, accum_dtype=self.grad_accum_dtype,
                remat=self.remat, snapshots=snapshots)
        except pk.PackingError as exc:
            raise UserError(f"training.packing: {exc}") from None
        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        stored = str(jax.tree.leaves(params)[0].dtype)
        self._save(out, params, {"kind": "finetune", "init": self.checkpoint_id(init), "steps": spec.steps,
                                 "seed": spec.seed, "examples": len(encoded), "packing": packing, "loss": loss,
                                 "compute_dtype": self.config.dtype}, dtype=stored)
        # The snapshot stays until this checkpoint is first loaded (resume.release): the run has
        # not recorded the stage yet, and a kill before it does retrains from the snapshot.
        ckpt_id = self.checkpoint_id(str(out))
        # Cached for generation in the compute dtype, laid out by the rule table (ZeRO-1
        # returns fp32 masters split over dp).
        cast = jax.jit(lambda p: jax.tree.map(lambda x: x.astype(jnp.dtype(self.config.dtype)), p),
                       out_shardings=sharding.tree_shardings(params, self.mesh))
        compute = cast(params)
        del params
        self._cache = ((str(out.resolve()), ckpt_id), self.config.dtype, compute)
        return TrainResult(checkpoint=str(out), checkpoint_id=ckpt_id, steps=spec.steps, tokens=tokens,
                           losses=tuple(losses))

    # ------------------------------------------------------------------ generate

    def generate(self, checkpoint: str, requests: Sequence[GenRequest], spec: GenSpec,
                 progress: Progress | None = None) -> list[str]:
        if not isinstance(spec.max_new_tokens, int) or spec.max_new_tokens < 0:
            raise UserError(f"generation.max_new_tokens: must be an int >= 0, got {spec.max_new_tokens!r}")
        if not spec.temperature >= 0:
            raise UserError(f"generation.temperature: must be >= 0, got {spec.temperature!r}")
        if not 0 < spec.top_p <= 1:
            raise UserError(f"generation.top_p: must be in (0, 1], got {spec.top_p!r}")
        if spec.batch_size < 1:
            raise UserError(f"generation.batch_size: must be >= 1, got {spec.batch_size!r}")
        if not requests:
            return []
        if spec.max_new_tokens == 0:
            if progress is not None:
                progress(len(requests))
            return [""] * len(requests)
        max_prompt = self.config.n_ctx - spec.max_new_tokens
        if max_prompt < 1:
            raise UserError(f"generation.max_new_tokens: {spec.max_new_tokens} leaves no room for a prompt "
                            f"in n_ctx={self.config.n_ctx}")
        return generate_text(self._load(checkpoint), requests, spec, tokenizer=self.tokenizer, config=self.config,
                             mesh=self.mesh, generation=self.generation, chunk=self.generation_chunk,
                             share_prefix=self.share_prefix, progress=progress)

    # ------------------------------------------------------------------ processes
    # Multi-process JAX: the core writes the run directory from process 0 and
    # waits at these barriers (star_engine.procs).

    @staticmethod
    def process_index() -> int:
        import jax

        return jax.process_index()

    @staticmethod
    def process_count() -> int:
        import jax

        return jax.process_count()

    @staticmethod
    def barrier(name: str) -> None:
        """All processes meet (``coordination.barrier``): ends with ``ProcessLost`` when another
        process failed (``abort``) or died, instead of waiting for it."""
        from . import coordination

        coordination.barrier(name)

    @staticmethod
    def abort(message: str) -> None:
        """This process is stopping: the others leave their barriers with ``message``."""
        from . import coordination

        coordination.abort(message)

    def validate_run(self, generation: Mapping[str, GenSpec], training: Mapping[str, TrainSpec]) -> None:
        """Every check the run's specs need before it starts (``Backend.validate_run``;
        ``preflight.py``): context length, sampling values, training sizes, the checkpoint's files."""
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

        return {"backend": BACKEND, "model": self.config.to_dict(), "param_count": param_count(self.config),
                "tokenizer": {k: v for k, v in self.tokenizer.to_dict().items() if k != "json"},
                "checkpoint_path": self._checkpoint_path, "seq_len": self.seq_len,
                "mesh": {"dp": int(self.mesh.shape["dp"]), "mp": int(self.mesh.shape["mp"])},
                "zero": self.zero, "opt_state_dtype": self.opt_state_dtype, "master_dtype": self.master_dtype,
                "grad_accum_dtype": self.grad_accum_dtype, "remat": self.remat, "generation": self.generation,
                "train_checkpoint_steps": self.train_checkpoint_steps,
                "train_checkpoint_minutes": self._train_checkpoint_minutes,
                "processes": self.process_count(),
                "devices": [str(d) for d in self.mesh.devices.flat]}


@hookimpl
def register_backends(register) -> None:
    register(BACKEND, HaikuXmapBackend)


@hookimpl
def register_commands(register) -> None:
    from .convert.commands import ConvertCommand, PlanCommand

    register("convert", ConvertCommand)
    register("plan", PlanCommand)
