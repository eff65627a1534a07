"""The ``[model]`` table (``ModelOptions``: the backend's options, declared once and checked
by the core's validator before the backend is built), what the options make together (the
model, its tokenizer, the training length: ``resolve``, the one place that checks options
against each other and against the checkpoint), and the optimizer tables' typed section
(``AdamW``), which the core checks and completes the ``[*.optimizer]`` tables by. Every
failure is a ``UserError`` whose ``key`` is the ``model.<option>`` at fault."""

from __future__ import annotations

import math
import re
import shlex
import dataclasses
from pathlib import Path
from dataclasses import dataclass
from collections.abc import Mapping
from typing import Annotated, Any, Literal, NamedTuple, get_args

from star_engine import NonNegInt, Section, UserError, above, at_least, between
from star_engine.helpers import check_table, is_int

from .checkpoint.format import MANIFEST, manifest_sha256, read_manifest
from .model.config import MAX_LAYERS, PRESETS, ConfigError, architecture as arch_of, config_from_dict
from .runtime.layout import mesh_shape
from .tokenizer import ByteTokenizer, HFTokenizer, tokenizer_from_dict

Dtype = Literal["float32", "bfloat16"]
Schedule = Literal["constant", "linear", "cosine"]
SCHEDULES = get_args(Schedule)
OptStateDtype = Literal["float32", "bfloat16", "mixed"]  # mixed: first moment bf16, second fp32
OPT_STATE_DTYPES = get_args(OptStateDtype)
SHAPE = ("n_layer", "d_model", "n_head", "d_head", "d_ff", "rotary_dim", "n_ctx", "n_kv_head", "vocab")
Size = Annotated[int | None, at_least(1)]  # None: the preset's, or the checkpoint's
MAX_CONTEXT = 1 << 20  # model.n_ctx: tokens; a training row of the context is allocated
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w./-]+)?")  # owner/name[@revision] (a branch, tag or commit)
BACKEND = "haiku_xmap"  # the name the backend registers under
MAX_CPU_DEVICES = 1024  # [model] cpu_devices: XLA:CPU's collectives fail at 4096 devices (jax 0.10), it crashes at 10^5


@dataclass(frozen=True)
class ModelOptions(Section):
    """The ``[model]`` table (``HaikuXmapBackend.Options``). ``architecture`` ("gptj" or
    "llama"; default: the checkpoint's, else the preset's), a preset (default "tiny", or
    "llama-tiny" for architecture "llama"; docs/models.md) with field overrides (when
    ``checkpoint_path`` is set the checkpoint carries its config, and an override that
    disagrees with it is an error), the tokenizer, the mesh and the maximum training length
    ``seq_len`` (default n_ctx); ``zero = 1`` partitions the optimizer state over "dp"
    (ZeRO-1), ``opt_state_dtype`` stores it in fp32 or bf16, ``master_dtype`` is the dtype of
    the trained weights (fp32 masters under bf16 compute by default; fine-tuned checkpoints
    store them), ``grad_accum_dtype`` the gradient accumulator's, ``remat`` recomputes each
    block in the backward pass instead of keeping its activations, ``loss_chunk`` computes the
    output projection and softmax of a training step over vocabulary chunks of that many rows,
    never holding the step's (tokens x vocabulary) logits (0 or unset: the plain path; 4096 is
    the measured choice on a CPU at vocabulary 50,400), ``loss_tokens`` runs the fine-tuning loss's
    output layer over token chunks with its gradients in the forward pass (``fused_ce.py``; 0: 2^25
    logits a chunk; DPO and scoring keep ``loss_chunk``'s), ``loss_dot_dtype = "bfloat16"`` runs a
    chunked output layer on bf16 operands, ``train_mesh`` (``{dp, mp}``, both given) trains on the
    first dp x mp devices of the mesh (one process; a CPU's ``{dp = 1, mp = 1}``: one device, every
    core), ``distributed`` starts
    multi-process JAX (``distributed.py``) and ``cpu_devices`` sets how many XLA:CPU devices
    (cores) the mesh spans (``machine.py``; default: one per core, ``use_every_core``).
    ``generation``: "continuous" (a slot whose row has ended takes the next prompt,
    ``continuous.py``) or "static" (length-sorted batches, each until its last row ends);
    ``generation_chunk``: decode steps between the host's stop-string checks and refills;
    ``share_prefix``: the tokens every prompt of a generation call starts with (a few-shot
    prompt) are prefilled once (continuous generation; ``continuous.shared_prefix``).
    ``decode_attention``: "dense" (every cache slot read, masked) or "ragged" (continuous
    generation's decode reads each row's cache to its own length: ``kernels.ragged``, a C++
    kernel built on first use; CPU, float32, mp = 1).
    ``train_checkpoint_steps`` / ``train_checkpoint_minutes``: how often a fine-tuning stage
    snapshots its whole training state so that a killed run resumes mid-stage (``resume.py``;
    0 = off; default: every 10 minutes, 30 for models of 1B parameters or more).
    ``hub_id``: the Hugging Face hub id (``owner/name[@revision]``) the checkpoint is converted
    from; a missing checkpoint's message then gives the exact ``convert`` command.
    ``checkpoint_sha256``: the sha256 of the checkpoint's manifest (its content id: the manifest
    holds every part's sha256, which every load verifies), pinned by the experiment; a checkpoint
    at ``checkpoint_path`` with another is refused before anything runs."""

    preset: str | None = None
    dtype: Dtype | None = None
    n_layer: Size = None
    d_model: Size = None
    n_head: Size = None
    d_head: Size = None
    d_ff: Size = None
    rotary_dim: Size = None
    n_ctx: Size = None
    n_kv_head: Size = None
    architecture: Literal["gptj", "llama"] | None = None
    vocab: Size = None
    tokenizer: Literal["byte", "hf"] = "byte"
    tokenizer_file: str = ""
    checkpoint_path: str = ""
    checkpoint_sha256: str = ""
    hub_id: str = ""
    mesh: dict | None = None
    train_mesh: dict | None = None
    seq_len: Annotated[int | None, at_least(2)] = None
    zero: Literal[0, 1] = 0
    opt_state_dtype: OptStateDtype = "float32"
    master_dtype: Dtype = "float32"
    grad_accum_dtype: Dtype = "float32"
    remat: bool = False
    loss_chunk: Annotated[int | None, at_least(0)] = None
    loss_tokens: Annotated[int | None, at_least(0)] = None
    loss_dot_dtype: Literal["bfloat16"] | None = None
    distributed: dict | Literal["auto"] | None = None
    cpu_devices: Size = None
    generation: Literal["continuous", "static"] = "continuous"
    generation_chunk: Annotated[int, between(1, 4096)] = 16
    share_prefix: bool = True
    decode_attention: Literal["dense", "ragged"] = "dense"
    train_checkpoint_steps: NonNegInt = 0
    train_checkpoint_minutes: Annotated[float | None, at_least(0)] = None

    @classmethod
    def from_table(cls, table: dict[str, Any]) -> ModelOptions:
        """A ``[model]`` table (less ``backend``) checked as the core checks it; a None value
        (no TOML value is) stands for the option's default."""
        return cls(**check_table({k: v for k, v in table.items() if v is not None}, cls.schema(), "model"))


@dataclass(frozen=True)
class AdamW(Section):
    """The ``[base_training.optimizer]`` and ``[training.optimizer]`` tables (the backend's:
    ``HaikuXmapBackend.optimizer_table``): global-norm clipping, then AdamW (weight decay on
    matrices only); the learning rate rises linearly from 0 to ``lr`` over ``warmup_steps``,
    then stays (``constant``) or anneals (``linear``, ``cosine``) to ``end_lr`` at the last
    step. The defaults are the paper's: 1e-6 after 100 warmup steps, constant."""

    lr: Annotated[float, above(0)] = 1e-6
    warmup_steps: Annotated[int, at_least(0)] = 100
    schedule: Schedule = "constant"
    end_lr: Annotated[float, at_least(0)] = 1e-6
    weight_decay: Annotated[float, at_least(0)] = 0.0
    clip_norm: Annotated[float, above(0)] = 1.0
    b1: Annotated[float, between(0, 1, hi_open=True)] = 0.9
    b2: Annotated[float, between(0, 1, hi_open=True)] = 0.999

    @classmethod
    def from_table(cls, table: Mapping[str, Any] | AdamW, key: str = "optimizer") -> AdamW:
        """An ``[*.optimizer]`` table (``TrainSpec.optimizer``: the core checked and completed
        it at load) as the object; a table a caller writes by hand is checked here, the
        ``UserError`` naming ``key.<name>``."""
        return table if isinstance(table, AdamW) else cls(**check_table(dict(table), cls.schema(), key))

    def schedule_fn(self, total_steps: int) -> Any:
        """The learning rate per step (an ``optax.Schedule``): linear warmup 0 -> lr over
        ``warmup_steps``, then constant, or a linear / cosine anneal to ``end_lr`` at ``total_steps``."""
        import optax  # jax-free options: optax when a job builds its optimizer

        decay_steps = max(1, total_steps - self.warmup_steps)
        if self.schedule == "constant":
            after = optax.constant_schedule(self.lr)
        elif self.schedule == "linear":
            after = optax.linear_schedule(self.lr, self.end_lr, decay_steps)
        else:
            after = optax.cosine_decay_schedule(self.lr, decay_steps, alpha=self.end_lr / self.lr)
        if self.warmup_steps == 0:
            return after
        return optax.join_schedules([optax.linear_schedule(0.0, self.lr, self.warmup_steps), after],
                                    [self.warmup_steps])

    def build(self, total_steps: int, learning_rate: Any = None) -> Any:
        """The optax transformation (levanter's ``AdamConfig.build``): global-norm clipping, then
        AdamW on ``schedule_fn(total_steps)``; weight decay on matrices only (LayerNorms and
        biases are not decayed). ``learning_rate``: another optax schedule in place of
        ``schedule_fn`` (``trainer.StepLr``: the step's own argument)."""
        import jax
        import optax

        lr = self.schedule_fn(total_steps) if learning_rate is None else learning_rate
        adamw = optax.adamw(lr, b1=self.b1, b2=self.b2, eps=1e-8,
                            weight_decay=self.weight_decay, mask=lambda p: jax.tree.map(lambda x: x.ndim >= 2, p))
        return optax.chain(optax.clip_by_global_norm(self.clip_norm), adamw)


@dataclass(frozen=True)
class TrainConfig:
    """One fine-tuning job as ``train`` runs it: the ``TrainSpec``'s sizes, seed, optimizer
    table, packing and loss; the backend's training length ``seq_len`` and pad token; the
    ``[model]`` training options (``zero``, ``opt_state_dtype``, ``master_dtype``,
    ``accum_dtype`` = ``grad_accum_dtype``, ``remat``, ``loss_chunk``, ``loss_tokens``); and for a LoRA stage its
    ``adapter``
    (``lora.LoraSpec``). Built once by the backend (``HaikuXmapBackend.train_config``; ``train.train``'s)."""

    steps: int
    batch_size: int
    grad_accum: int
    seed: int
    optimizer: AdamW  # a table given here (a Mapping) becomes the object, checked once (__post_init__)
    seq_len: int
    pad_id: int
    packing: str = "segments"
    loss: str = "completion"
    zero: int = 0
    opt_state_dtype: str = "float32"
    master_dtype: str = "float32"
    accum_dtype: str = "float32"
    remat: bool = False
    adapter: Any = None  # lora.LoraSpec
    loss_chunk: int | None = None  # token_logp's: None is the plain path
    loss_tokens: int | None = None  # token_loss's fused output layer (fused_ce.py): None is off
    loss_dot_dtype: str | None = None  # the chunked output layers' matmul operands (None: the weights' dtype)

    def __post_init__(self) -> None:
        object.__setattr__(self, "optimizer", AdamW.from_table(self.optimizer))


@dataclass(frozen=True)
class DecodeConfig:
    """How a generation call decodes (``sampling.static.generate_batches``, ``sampling.continuous.generate``; built
    once per call by ``HaikuXmapBackend.decode_config`` from its options and the ``GenSpec``):
    ``temperature`` (0: greedy) and ``top_p``; the tokenizer's end-of-text and pad ids and
    ``valid_vocab`` (ids at or above it, a padded vocabulary's rows, are never produced);
    ``slots`` rows decoding together. Continuous batching: ``chunk`` decode steps at most
    between the host's checks and refills, ``refill`` (rows of a shard that, once ended while
    prompts wait, end a chunk early; None: an eighth of a shard's slots), ``share_prefix``
    (``continuous.shared_prefix``), ``attention`` (continuous decoding: "dense" or "ragged",
    ``layers.decode_attention``). How many new tokens each row may take is the call's
    (``budgets``: the ``GenSpec``'s ``max_new_tokens``, its one route)."""

    temperature: float
    top_p: float
    eos_id: int
    pad_id: int
    valid_vocab: int | None = None
    slots: int = 8
    chunk: int = 16
    refill: int | None = None
    share_prefix: bool = True
    attention: str = "dense"


MASTER_DTYPES = ACCUM_DTYPES = get_args(Dtype)


def check_dtypes(config: Any, master_dtype: str, accum_dtype: str = "float32") -> None:
    """ValueError for a master dtype coarser than the compute dtype or an unknown dtype."""
    if master_dtype not in MASTER_DTYPES:
        raise ValueError(f"master_dtype must be one of {list(MASTER_DTYPES)}, got {master_dtype!r}")
    if accum_dtype not in ACCUM_DTYPES:
        raise ValueError(f"grad_accum_dtype must be one of {list(ACCUM_DTYPES)}, got {accum_dtype!r}")
    if master_dtype == "bfloat16" and config.dtype == "float32":
        raise ValueError("master_dtype bfloat16 under float32 compute would round every update; use float32")


class Model(NamedTuple):
    """What the options make together: the model's config, its tokenizer, the training length."""

    config: Any
    tokenizer: Any
    seq_len: int


def train_config(o: ModelOptions, model: Model, spec: Any, adapter: Any = None, optimizer: AdamW | None = None
                 ) -> TrainConfig:
    """The ``TrainConfig`` of ``spec`` (a ``TrainSpec``: its ``optimizer`` an ``AdamW``, used as
    it is, or a table, checked) under the ``[model]`` options ``o`` and ``model`` (``adapter``: a
    LoRA stage's ``lora.LoraSpec``; ``optimizer``: the object when the caller has it)."""
    return TrainConfig(steps=spec.steps, batch_size=spec.batch_size, grad_accum=spec.grad_accum, seed=spec.seed,
                       optimizer=optimizer or AdamW.from_table(spec.optimizer), seq_len=model.seq_len,
                       pad_id=model.tokenizer.pad_id, packing=spec.packing, loss=spec.loss, zero=o.zero,
                       opt_state_dtype=o.opt_state_dtype, master_dtype=o.master_dtype,
                       accum_dtype=o.grad_accum_dtype, remat=o.remat, adapter=adapter, loss_chunk=o.loss_chunk,
                       loss_tokens=o.loss_tokens, loss_dot_dtype=o.loss_dot_dtype)


def check_generation(key: str, n: int, n_ctx: int) -> None:
    """``max_new_tokens`` ``n`` (of TOML section ``key``) against a model of context ``n_ctx``: room
    for a prompt. The one check of the value against the model (``validate_run``, ``plan``)."""
    if n >= n_ctx:
        raise UserError(f"{key}.max_new_tokens: {n} leaves no room for a prompt in the model's context of "
                        f"n_ctx = {n_ctx} tokens (model.n_ctx); use at most {n_ctx - 1}",
                        key=f"{key}.max_new_tokens")


def decode_config(o: ModelOptions, tokenizer: Any, spec: Any) -> DecodeConfig:
    """The ``DecodeConfig`` of ``spec`` (a ``GenSpec``) under the options ``o`` and ``tokenizer``."""
    return DecodeConfig(temperature=float(spec.temperature), top_p=float(spec.top_p), eos_id=tokenizer.eos_id,
                        pad_id=tokenizer.pad_id, valid_vocab=tokenizer.vocab_size, slots=spec.batch_size,
                        chunk=o.generation_chunk, share_prefix=o.share_prefix, attention=o.decode_attention)


def _fail(name: str, message: str) -> UserError:
    return UserError(f"model.{name}: {message}", key=f"model.{name}")


def base_config(o: ModelOptions) -> tuple[Any, dict | None]:
    """The config the overrides apply to (the checkpoint's, else the preset's) and the
    checkpoint's stored tokenizer (None without a checkpoint)."""
    if o.checkpoint_path:
        missing = missing_checkpoint(o.checkpoint_path, o.hub_id, o.mesh, o.checkpoint_sha256)
        if missing:
            raise _fail("checkpoint_path", missing)
        pinned(o)
        manifest = read_manifest(o.checkpoint_path)
        base = config_from_dict(manifest["model_config"])
        if o.architecture is not None and o.architecture != arch_of(base):
            raise _fail("architecture", f"{o.architecture!r} disagrees with the checkpoint's {arch_of(base)!r} "
                                        f"({o.checkpoint_path})")
        for key in SHAPE:
            value = getattr(o, key)
            if value is not None and value != getattr(base, key, None):
                raise _fail(key, f"{value} disagrees with the checkpoint's {getattr(base, key)} "
                                 f"({o.checkpoint_path})")
        return base, manifest["tokenizer"]
    if o.checkpoint_sha256:
        raise _fail("checkpoint_sha256", "has no effect without model.checkpoint_path; remove it, or set "
                                         "model.checkpoint_path to the checkpoint it pins")
    preset = o.preset or ("llama-tiny" if o.architecture == "llama" else "tiny")
    if preset not in PRESETS:
        raise _fail("preset", f"unknown preset {preset!r}; known: {sorted(PRESETS)}")
    base = PRESETS[preset]
    if o.architecture is not None and o.architecture != arch_of(base):
        raise _fail("architecture", f"{o.architecture!r} disagrees with preset {preset!r} ({arch_of(base)!r})")
    return base, None


def pinned(o: ModelOptions) -> None:
    """Refuses a checkpoint whose manifest sha256 is not ``model.checkpoint_sha256`` (when set)."""
    want = o.checkpoint_sha256.lower()
    if not want:
        return
    if len(want) != 64 or any(c not in "0123456789abcdef" for c in want):
        raise _fail("checkpoint_sha256", f"{o.checkpoint_sha256!r} is not a sha256 (64 hexadecimal digits)")
    have = manifest_sha256(o.checkpoint_path)
    if have != want:
        raise _fail("checkpoint_sha256", f"{o.checkpoint_path} holds checkpoint {have}, not the {want} this "
                                         f"experiment pins (a different or retrained checkpoint: pin its id, "
                                         f"or restore the pinned one)")


def missing_checkpoint(path: str, hub_id: str = "", mesh: Mapping[str, Any] | None = None, sha256: str = "") -> str:
    """"" when ``path`` (``model.checkpoint_path``) holds a checkpoint (a manifest); else what is
    there and the exact command that makes it: ``convert --from hf`` of ``hub_id``
    (``model.hub_id``; a placeholder without it) into that path, ``--mp`` of the ``mesh``; for a
    checkpoint pinned by ``sha256`` (``model.checkpoint_sha256``) and named by no hub id (one
    committed with the experiment, which no conversion makes), the pinned id and the key to set.
    ``validate``/``run`` (``base_config``) and ``plan`` (``plan/experiment.py``) say it."""
    root = Path(path)
    if (root / MANIFEST).is_file():
        return ""
    mp = (mesh or {}).get("mp")
    split = f" --mp {mp}" if isinstance(mp, int) and not isinstance(mp, bool) and mp > 1 else ""
    if (root / "config.json").is_file():
        return (f"{root} is a Hugging Face folder, not a checkpoint of this backend; convert it once into another "
                f"folder and set model.checkpoint_path to that: "
                f"star-engine convert --from hf {shlex.quote(str(root))} {shlex.quote(str(root) + '-native')}{split}")
    what = "does not exist" if not root.exists() else f"holds no checkpoint (no {MANIFEST})"
    if sha256 and not hub_id:
        return (f"{root} {what}; this experiment pins checkpoint {sha256} (model.checkpoint_sha256): set "
                f"model.checkpoint_path to the folder that holds it (a copied experiment file: where the "
                f"original's checkpoint is), e.g. --set model.checkpoint_path=...")
    source = shlex.quote(hub_id) if hub_id else "<a Hugging Face folder or hub id>"
    return (f"{root} {what}; make it with: star-engine convert --from hf {source} {shlex.quote(str(root))}{split}"
            f" (docs/models.md{'' if hub_id else '; model.hub_id names the source in this message'})")


def _config_error(exc: ConfigError) -> UserError:
    """A config refusal (a rule across its fields) as the ``[model]`` key it is about."""
    return _fail(exc.field, exc.rule)


def resolve(o: ModelOptions) -> Model:
    """The model, tokenizer and training length the options make (reads the checkpoint's
    manifest, never its weights; starts nothing). Checks the options against each other."""
    if o.hub_id and not HUB_ID.fullmatch(o.hub_id):
        raise _fail("hub_id", f"expected a Hugging Face hub id, owner/name or owner/name@revision, got {o.hub_id!r}")
    base, stored_tok = base_config(o)
    overrides = {k: getattr(o, k) for k in SHAPE if getattr(o, k) is not None}
    for key, most in (("n_layer", MAX_LAYERS), ("n_ctx", MAX_CONTEXT)):
        if overrides.get(key, 0) > most:
            raise _fail(key, f"at most {most}, got {overrides[key]}")
    if (o.cpu_devices or 0) > MAX_CPU_DEVICES:
        raise _fail("cpu_devices", f"at most {MAX_CPU_DEVICES}, got {o.cpu_devices}")
    fields = {f.name for f in dataclasses.fields(base)}
    for key in overrides:
        if key not in fields:
            raise _fail(key, "not an option of this architecture")
    try:
        config = base.replace(**overrides, **({"dtype": o.dtype} if o.dtype else {}))
    except ConfigError as exc:
        raise _config_error(exc) from None
    if o.tokenizer_file:
        tokenizer: ByteTokenizer | HFTokenizer = HFTokenizer(o.tokenizer_file)
    elif stored_tok is not None:
        tokenizer = tokenizer_from_dict(stored_tok)
    elif o.tokenizer == "hf":
        raise _fail("tokenizer_file", "required when model.tokenizer = 'hf'")
    else:
        tokenizer = ByteTokenizer()
    try:
        check_dtypes(config, o.master_dtype, o.grad_accum_dtype)
    except ValueError as exc:
        raise _fail("grad_accum_dtype" if "grad_accum_dtype" in str(exc) else "master_dtype", str(exc)) from None
    if tokenizer.vocab_size > config.vocab:
        raise _fail("vocab", f"{config.vocab} is smaller than the tokenizer's {tokenizer.vocab_size} tokens")
    seq_len = config.n_ctx if o.seq_len is None else o.seq_len
    if seq_len > config.n_ctx:
        raise _fail("seq_len", f"must be an int in [2, n_ctx={config.n_ctx}], got {o.seq_len!r}")
    if o.mesh is not None:  # its form; the device count is the runtime's (machine.start_runtime)
        fixed = [v for v in o.mesh.values() if is_int(v) and v > 0]
        try:
            mesh_shape(o.mesh, math.prod(fixed))
        except ValueError as exc:
            raise _fail("mesh", str(exc)) from None
    if o.loss_dot_dtype is not None and not (o.loss_tokens is not None or o.loss_chunk):
        raise _fail("loss_dot_dtype", "applies to a chunked output layer: set model.loss_tokens (or model.loss_chunk)")
    if o.decode_attention == "ragged" and config.dtype != "float32":
        raise _fail("decode_attention", f"'ragged' reads float32 caches; this model computes in {config.dtype}")
    if o.decode_attention == "ragged" and o.mesh is not None and o.mesh.get("mp", 1) not in (1, None):
        raise _fail("decode_attention", f"'ragged' runs each dp shard's rows on one device: it needs mp = 1, "
                                        f"got model.mesh = {dict(o.mesh)!r}")
    if o.train_mesh is not None:  # both sizes given: a sub-mesh of the run's (machine.train_mesh)
        sizes = [o.train_mesh.get(a) for a in ("dp", "mp")]
        try:
            if not all(is_int(v) and v > 0 for v in sizes):
                raise ValueError(f"dp and mp must both be positive ints, got {dict(o.train_mesh)!r}")
            mesh_shape(o.train_mesh, math.prod(int(v) for v in sizes if v is not None))
        except ValueError as exc:
            raise _fail("train_mesh", str(exc)) from None
    return Model(config, tokenizer, seq_len)
