"""The ``haiku_xmap`` backend: GPT-J (dm-haiku) on a (dp, mp) mesh.

Checkpoints are native checkpoint directories (``checkpoint.py``); a
checkpoint's id is the sha256 of its manifest. jax is imported when a backend
is built, not when the plugin is discovered.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

from star_engine import hookimpl
from star_engine.api import GenRequest, GenSpec, Progress, TrainExample, TrainResult, TrainSpec
from star_engine.errors import UserError

from .config import DTYPES, PRESETS, GPTJConfig

BACKEND = "haiku_xmap"
BASE_DIR = "base_init"


def _config_error(exc: Exception) -> str:
    """A GPTJConfig refusal as the ``[model]`` key it is about: ``model.n_layer: must be ...``."""
    m = re.match(r"GPTJConfig\.(\w+) (.*)$", str(exc), re.DOTALL)
    return f"model.{m.group(1)}: {m.group(2)}" if m else f"model: {exc}"


def _cut_at_stop(text: str, stops: Sequence[str]) -> str:
    """``text`` before the earliest occurrence of any stop string."""
    cut = len(text)
    for s in stops:
        if s:
            i = text.find(s)
            if 0 <= i < cut:
                cut = i
    return text[:cut]


class HaikuXmapBackend:
    """``[model]`` options: a preset with field overrides (ignored when
    ``checkpoint_path`` is set: the checkpoint carries its config, and an override
    that disagrees with it is an error), the tokenizer, the mesh and the maximum
    training length ``seq_len`` (default n_ctx); ``zero = 1`` partitions the
    optimizer state over "dp" (ZeRO-1), ``opt_state_dtype`` stores it in fp32 or
    bf16, ``distributed`` starts multi-process JAX and ``cpu_devices`` sets how
    many XLA:CPU devices (cores) the mesh spans (``distributed.py``)."""

    def __init__(self, preset: str = "tiny", dtype: str | None = None, n_layer: int | None = None,
                 d_model: int | None = None, n_head: int | None = None, d_head: int | None = None,
                 d_ff: int | None = None, rotary_dim: int | None = None, n_ctx: int | None = None,
                 vocab: int | None = None, tokenizer: str = "byte", tokenizer_file: str = "",
                 checkpoint_path: str = "", mesh: Mapping[str, Any] | None = None,
                 seq_len: int | None = None, zero: int = 0, opt_state_dtype: str = "float32",
                 distributed: Mapping[str, Any] | str | None = None, cpu_devices: int | None = None) -> None:
        from . import distributed as dist

        # Before anything starts jax's backends (make_mesh below lists the devices).
        if cpu_devices is not None:
            dist.set_cpu_devices(cpu_devices)
        self._distributed = dist.initialize(distributed)
        if self._distributed:  # the other processes' barriers see this one alive from now on
            from .coordination import start_heartbeat

            start_heartbeat()
        if isinstance(zero, bool) or zero not in (0, 1):
            raise UserError(f"model.zero: must be 0 (off) or 1 (ZeRO-1: optimizer state split over dp), got {zero!r}")
        if opt_state_dtype not in dist.OPT_STATE_DTYPES:
            raise UserError(f"model.opt_state_dtype: must be one of {list(dist.OPT_STATE_DTYPES)}, "
                            f"got {opt_state_dtype!r}")
        self.zero, self.opt_state_dtype = zero, opt_state_dtype

        from . import checkpoint as ckpt
        from . import sharding
        from .tokenizer import ByteTokenizer, HFTokenizer, tokenizer_from_dict

        if dtype is not None and dtype not in DTYPES:
            raise UserError(f"model.dtype: must be one of {list(DTYPES)}, got {dtype!r}")
        overrides = dict(n_layer=n_layer, d_model=d_model, n_head=n_head, d_head=d_head, d_ff=d_ff,
                         rotary_dim=rotary_dim, n_ctx=n_ctx, vocab=vocab)
        self._checkpoint_path = str(checkpoint_path) if checkpoint_path else ""
        stored_tok = None
        if self._checkpoint_path:
            manifest = ckpt.read_manifest(self._checkpoint_path)
            base = GPTJConfig.from_dict(manifest["model_config"])
            for key, value in overrides.items():
                if value is not None and value != getattr(base, key):
                    raise UserError(f"model.{key}: {value} disagrees with the checkpoint's {getattr(base, key)} "
                                    f"({self._checkpoint_path})")
            stored_tok = manifest["tokenizer"]
            self._ckpt_dtype = base.dtype
        else:
            if preset not in PRESETS:
                raise UserError(f"model.preset: unknown preset {preset!r}; known: {sorted(PRESETS)}")
            base = PRESETS[preset]
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
        if self.tokenizer.vocab_size > self.config.vocab:
            raise UserError(f"model.vocab: {self.config.vocab} is smaller than the tokenizer's "
                            f"{self.tokenizer.vocab_size} tokens")

        self.seq_len = self.config.n_ctx if seq_len is None else seq_len
        n = self.seq_len
        if isinstance(n, bool) or not isinstance(n, int) or not 2 <= n <= self.config.n_ctx:
            raise UserError(f"model.seq_len: must be an int in [2, n_ctx={self.config.n_ctx}], got {seq_len!r}")
        if mesh is not None and not isinstance(mesh, Mapping):
            raise UserError(f"model.mesh: must be a table like {{dp = -1, mp = 1}}, got {mesh!r}")
        self._mesh_cfg = {"dp": -1, "mp": 1} if mesh is None else dict(mesh)
        try:
            self.mesh = sharding.make_mesh(self._mesh_cfg)
        except ValueError as exc:
            raise UserError(f"model.mesh: {exc}") from None
        self._cache: tuple[tuple[str, str], Any] | None = None  # ((path, checkpoint id), params)

    # ------------------------------------------------------------------ checkpoints

    def _save(self, path: Path, params: Any, extra: dict) -> None:
        import jax

        from . import distributed as dist
        from .checkpoint import save_checkpoint, write_checkpoint

        # On an mp > 1 mesh the mp-sharded leaves are stored as mp parts, so that a
        # later load reads only each device's slice (checkpoint.py, version 2).
        mp_split = int(self.mesh.shape["mp"])
        if jax.process_count() == 1:
            save_checkpoint(path, params, model_config=self.config.to_dict(), tokenizer=self.tokenizer.to_dict(),
                            extra=extra, mp_split=mp_split)
            return
        # Several processes: every one takes part in the per-leaf gathers, process 0
        # writes (the path must be on a filesystem all of them see), then all wait.
        leaves = dist.host_leaves(params)
        if dist.is_primary():
            write_checkpoint(path, leaves, model_config=self.config.to_dict(), tokenizer=self.tokenizer.to_dict(),
                             extra=extra, mp_split=mp_split)
        else:
            for _ in leaves:
                pass
        dist.barrier(f"saved {path}")

    def checkpoint_id(self, checkpoint: str) -> str:
        from .checkpoint import manifest_sha256

        return manifest_sha256(checkpoint)

    def _load(self, checkpoint: str) -> Any:
        """Params of ``checkpoint`` on the mesh, cast to the configured dtype (last one cached)."""
        import jax

        from . import model, sharding
        from .checkpoint import load_checkpoint, read_manifest

        key = (str(Path(checkpoint).resolve()), self.checkpoint_id(checkpoint))
        if self._cache is not None and self._cache[0] == key:
            return self._cache[1]
        stored = GPTJConfig.from_dict(read_manifest(checkpoint)["model_config"])
        if stored.replace(dtype=self.config.dtype) != self.config:
            raise UserError(f"{checkpoint}: its model config {stored.to_dict()} is not this backend's "
                            f"{self.config.to_dict()}")
        shapes = jax.eval_shape(lambda k: model.init_params(stored, k), jax.random.key(0))
        params, _ = load_checkpoint(checkpoint, shardings=sharding.tree_shardings(shapes, self.mesh))
        params = jax.tree.map(lambda p: p.astype(model.dtype_of(self.config)), params)
        self._cache = (key, params)
        return params

    def base(self, workdir: Path, seed: int) -> str:
        from . import model
        from .checkpoint import read_manifest
        from .sample import keys_from_seeds

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
        from . import train as tr

        for name in ("steps", "batch_size", "grad_accum"):
            value = getattr(spec, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < (0 if name == "steps" else 1):
                raise UserError(f"training.{name}: must be an int >= {0 if name == 'steps' else 1}, got {value!r}")
        encoded = []
        for i, ex in enumerate(examples):
            try:
                encoded.append(tr.encode_example(self.tokenizer, ex.prompt, ex.completion, self.seq_len))
            except ValueError as exc:
                raise UserError(f"training example {i}: {exc}") from None
        if spec.steps > 0 and not encoded:
            raise UserError(f"training: {spec.steps} steps requested but there are no training examples")
        try:
            tr.optimizer_options(spec.optimizer)
        except ValueError as exc:
            raise UserError(f"training.{exc}") from None
        import jax

        from . import distributed as dist

        run = tr.train
        if self.zero or self.opt_state_dtype != "float32" or jax.process_count() > 1:
            run = functools.partial(dist.train, zero=self.zero, opt_state_dtype=self.opt_state_dtype)
        params, losses, tokens = run(
            self._load(init), self.config, encoded, steps=spec.steps, batch_size=spec.batch_size,
            grad_accum=spec.grad_accum, seed=spec.seed, optimizer=spec.optimizer, seq_len=self.seq_len,
            pad_id=self.tokenizer.pad_id, mesh=self.mesh, progress=progress)
        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        self._save(out, params, {"kind": "finetune", "init": self.checkpoint_id(init), "steps": spec.steps,
                                 "seed": spec.seed, "examples": len(encoded)})
        ckpt_id = self.checkpoint_id(str(out))
        self._cache = ((str(out.resolve()), ckpt_id), params)
        return TrainResult(checkpoint=str(out), checkpoint_id=ckpt_id, steps=spec.steps, tokens=tokens,
                           losses=tuple(losses))

    # ------------------------------------------------------------------ generate

    def generate(self, checkpoint: str, requests: Sequence[GenRequest], spec: GenSpec,
                 progress: Progress | None = None) -> list[str]:
        import jax

        from . import sample, sharding
        from .train import bucket_lengths

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
        params = self._load(checkpoint)
        tok = self.tokenizer
        # Prompts longer than the context keep their end; an empty one starts from end-of-text.
        prompts = [(tok.encode(r.prompt) or [tok.eos_id])[-max_prompt:] for r in requests]
        order = sorted(range(len(requests)), key=lambda i: len(prompts[i]))  # similar lengths share a batch
        dp = sharding.dp_size(self.mesh)
        rows = -(-spec.batch_size // dp) * dp
        buckets = bucket_lengths(max_prompt)
        from . import distributed as dist

        rows_sh = sharding.batch_sharding(self.mesh)
        keys_sh = sharding.batch_sharding(self.mesh, ndim=1)
        keys_data_sh = sharding.batch_sharding(self.mesh, ndim=2)
        results: list[str] = [""] * len(requests)
        for start in range(0, len(order), spec.batch_size):
            group = order[start:start + spec.batch_size]
            longest = max(len(prompts[i]) for i in group)
            T = next(b for b in buckets if b >= longest)
            batch = [prompts[i] for i in group] + [[tok.eos_id]] * (rows - len(group))
            tokens_BT, mask_BT = sample.left_pad(batch, tok.pad_id, length=T)
            seeds = [requests[i].seed for i in group] + [0] * (rows - len(group))
            keys_B = sample.keys_from_seeds(seeds)
            if jax.process_count() > 1:  # global arrays from each process's slices
                tokens_BT, mask_BT = dist.global_array(tokens_BT, rows_sh), dist.global_array(mask_BT, rows_sh)
                keys_B = jax.random.wrap_key_data(dist.global_array(jax.random.key_data(keys_B), keys_data_sh))
            out_BN = sample.generate(
                params, jax.device_put(tokens_BT, rows_sh), jax.device_put(mask_BT, rows_sh),
                jax.device_put(keys_B, keys_sh), float(spec.temperature),
                float(spec.top_p), config=self.config, max_new_tokens=spec.max_new_tokens,
                eos_id=tok.eos_id, valid_vocab=tok.vocab_size, mesh=self.mesh)
            out_BN = dist.to_host(out_BN)
            for row, i in enumerate(group):
                text = tok.decode(sample.trim(out_BN[row], tok.eos_id))
                results[i] = _cut_at_stop(text, spec.stop)
            if progress is not None:
                progress(len(group))
        return results

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
        ``preflight.py``): context length, sampling values, optimizer tables, the checkpoint's files."""
        from .preflight import validate_run

        validate_run(self, generation, training)

    def describe(self) -> Mapping[str, Any]:
        from .config import param_count

        return {"backend": BACKEND, "model": self.config.to_dict(), "param_count": param_count(self.config),
                "tokenizer": {k: v for k, v in self.tokenizer.to_dict().items() if k != "json"},
                "checkpoint_path": self._checkpoint_path, "seq_len": self.seq_len,
                "mesh": {"dp": int(self.mesh.shape["dp"]), "mp": int(self.mesh.shape["mp"])},
                "zero": self.zero, "opt_state_dtype": self.opt_state_dtype,
                "processes": self.process_count(),
                "devices": [str(d) for d in self.mesh.devices.flat]}


@hookimpl
def register_backends(register) -> None:
    register(BACKEND, HaikuXmapBackend)


@hookimpl
def register_commands(register) -> None:
    from .commands import ConvertCommand, PlanCommand

    register("convert", ConvertCommand)
    register("plan", PlanCommand)
