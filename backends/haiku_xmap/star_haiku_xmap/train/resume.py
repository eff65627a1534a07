"""Training snapshots: a fine-tuning stage killed midway resumes from its last snapshot.

While a stage trains towards ``<out>`` (its checkpoint folder), the trainer writes its
whole state to ``<out>.partial/`` every ``model.train_checkpoint_steps`` optimizer steps
or ``model.train_checkpoint_minutes`` minutes, whichever comes first: the master
weights, the optimizer state (Adam's moments and count), the step, and the losses and
loss-token count so far. The position in the data order is the step: the batches are a
pure function of the seed (``packing.step_batches``), so a resumed stage rebuilds them
and skips the steps already taken. The update is deterministic, so the resumed stage's
final parameters are bit-identical to an uninterrupted one's.

The snapshot is a checkpoint folder (``checkpoint/format.py``'s format: msgpack manifest,
one zstd part per leaf with its sha256, mp-sharded leaves stored as one part per mp
shard, written to a temporary sibling, fsynced and renamed into place; never pickle).
Its leaves are the state's key paths (``params/h_0/attn/q/w``, ``opt_state/1/0/mu/...``)
and its manifest's ``extra`` holds the stage's identity (``key``: the init checkpoint's
id, the training spec, a hash of the examples, the model config, dtypes, mesh and
optimizer-state layout), the step, the losses and the token count. A rerun of the
stage loads it only when all of these match and every part verifies; otherwise it
is deleted and the stage starts from step 0. It outlives the stage's checkpoint until
the run has recorded that checkpoint (``release``, from ``HaikuXmapBackend.checkpoint_recorded``,
which the core calls once the stage's ``train.json`` is written): a kill between the
checkpoint's write and the run's record of it, which makes the run train the stage
again, then costs the steps since the last snapshot, not the whole stage.

Cost: a snapshot holds the master weights plus two Adam moments, about 3x the
fp32 weights (12 bytes a parameter; 8 with ``opt_state_dtype = "bfloat16"``): ~72 GB
for GPT-J 6B, so the default interval grows with the model (``default_minutes``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from pathlib import Path
from typing import Any, NamedTuple
from collections.abc import Mapping, Sequence

import jax
import numpy as np
from jax.experimental import multihost_utils

from star_engine import IntegrityError, UserError
from star_engine.helpers import temporary_sibling

from ..checkpoint.format import MANIFEST, load_leaf_sharded, read_leaf, read_manifest
from ..checkpoint.write import manifest_bytes, write_checkpoint
from ..model.network import param_count
from ..options import ModelOptions
from ..session import distributed as dist
from ..session.weights import Weights

SUFFIX = ".partial"
FORMAT = "star-haiku-xmap-train-snapshot"
SMALL_MODEL_MINUTES = 10.0  # a save of a small model takes seconds
LARGE_MODEL_MINUTES = 30.0  # >= 1B parameters: a snapshot is tens of GB (minutes to write)
LARGE_MODEL = 1_000_000_000


def default_minutes(n_params: int) -> float:
    """The default ``train_checkpoint_minutes``: 10 below 1B parameters, 30 from there."""
    return SMALL_MODEL_MINUTES if n_params < LARGE_MODEL else LARGE_MODEL_MINUTES


def snapshot_dir(out: str | Path) -> Path:
    """Where the stage writing checkpoint ``out`` keeps its snapshot: ``<out>.partial``."""
    out = Path(out)
    return out.with_name(out.name + SUFFIX)


def examples_sha256(encoded: Sequence[Any]) -> str:
    """A content hash of the encoded training examples (ids and prompt lengths)."""
    h = hashlib.sha256()
    for e in encoded:
        ids = np.ascontiguousarray(e.ids, dtype="<i4")
        h.update(np.asarray([ids.size, e.n_prompt], dtype="<i8").tobytes())
        h.update(ids.tobytes())
    return h.hexdigest()


def leaf_paths(tree: Any) -> list[tuple[str, ...]]:
    """Every leaf's key path as strings (dict keys, namedtuple fields, tuple indices)."""
    def name(k: Any) -> str:
        for attr in ("key", "name", "idx"):
            if hasattr(k, attr):
                return str(getattr(k, attr))
        raise TypeError(f"unsupported key {k!r}")

    paths = [tuple(name(k) for k in kp) for kp, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]
    if len(set(paths)) != len(paths):
        raise ValueError("training state leaves with the same key path")
    return paths


def stage_snapshots(weights: Weights, options: ModelOptions, init: str, out: str | Path, spec: Any,
                    encoded: Sequence[Any], objective: Mapping[str, Any] | None = None) -> Snapshots:
    """The snapshots of the training stage that writes ``out`` from checkpoint ``init`` with
    ``spec`` (a ``TrainSpec``) on the backend's ``weights`` under its ``[model]`` ``options``:
    keyed by everything that decides its steps, so that only a rerun of the very same stage
    loads one. ``objective``: what else decides them, for a stage that is not ``train``'s (the
    verifier's DPO: ``{"kind": "dpo", "beta": ...}``, ``encoded`` its pairs' sequences).
    ``model.train_checkpoint_minutes`` None: ``default_minutes`` for the backend's model."""
    o, config = options, weights.config
    mesh = [int(weights.mesh.shape["dp"]), int(weights.mesh.shape["mp"])]
    key = {"init": weights.checkpoint_id(init), "steps": spec.steps, "batch_size": spec.batch_size,
           "grad_accum": spec.grad_accum, "seed": spec.seed, "optimizer": _table(spec.optimizer),
           "packing": spec.packing, "loss": spec.loss, "examples": examples_sha256(encoded),
           "model_config": config.to_dict(), "seq_len": weights.seq_len,
           "master_dtype": o.master_dtype, "grad_accum_dtype": o.grad_accum_dtype,
           "zero": o.zero, "opt_state_dtype": o.opt_state_dtype, "remat": o.remat,
           "mesh": mesh, "processes": jax.process_count()}
    if spec.adapter is not None:  # a LoRA stage (lora_stage.py)
        key["adapter"] = _table(spec.adapter)
    elif o.train_mesh is not None:  # trained on a sub-mesh (machine.train_mesh): its steps are that mesh's
        key["train_mesh"] = mesh = [int(o.train_mesh["dp"]), int(o.train_mesh["mp"])]
    for name in ("loss_tokens", "loss_dot_dtype"):  # set only: the keys of stages without them stay as they were
        if getattr(o, name) is not None:
            key[name] = getattr(o, name)
    if objective is not None:
        key["objective"] = dict(objective)
    minutes = o.train_checkpoint_minutes
    return Snapshots(snapshot_dir(out), key, steps=spec.steps, every_steps=o.train_checkpoint_steps,
                     every_minutes=default_minutes(param_count(config)) if minutes is None else minutes,
                     model_config=config.to_dict(), tokenizer=weights.tokenizer.to_dict(), mp_split=mesh[1])


def _table(value: Any) -> dict:
    """A ``TrainSpec``'s option table as the key holds it: a table as given, an object
    (``options.AdamW``, ``options.LoraOptions``) as its table."""
    return dict(value) if isinstance(value, Mapping) else value.as_dict()


class Restored(NamedTuple):
    state: Any  # the TrainState at ``step``
    step: int
    losses: list  # per-step losses of the steps taken (float32 scalars)
    tokens: int


class Snapshots:
    """The snapshots of one training stage (``train.train`` calls
    ``restore`` before the first step and ``step_done`` after each)."""

    def __init__(self, path: str | Path, key: Mapping[str, Any], *, steps: int, every_steps: int,
                 every_minutes: float, model_config: dict, tokenizer: dict, mp_split: int = 1) -> None:
        self.path, self.key = Path(path), dict(key)
        self.steps, self.every_steps, self.every_minutes = steps, every_steps, float(every_minutes)
        self.model_config, self.tokenizer, self.mp_split = model_config, tokenizer, mp_split
        self._last = time.monotonic()
        self.saved = 0  # snapshots written by this process

    # ------------------------------------------------------------------ restore

    def restore(self, abstract_state: Any, shardings: Any = None) -> Restored | None:
        """The state saved for this stage, on the devices with ``shardings`` (None: the
        default device), or None (no snapshot, or one that does not match: deleted)."""
        self._last = time.monotonic()
        if not (self.path / MANIFEST).is_file():
            if self.path.exists():
                self.discard()  # a folder without a manifest is no snapshot
            return None
        try:
            restored = self._load(read_manifest(self.path), abstract_state, shardings)
        except (IntegrityError, UserError, OSError, ValueError, KeyError, TypeError):
            restored = None  # damaged or not this stage's: start the stage over
        if restored is None:
            self.discard()
        return restored

    def _load(self, m: dict, abstract_state: Any, shardings: Any) -> Restored | None:
        extra = m["extra"]
        if extra.get("format") != FORMAT or manifest_bytes(extra.get("key")) != manifest_bytes(self.key):
            return None
        step, losses, tokens = extra.get("step"), extra.get("losses"), extra.get("tokens")
        if type(step) is not int or not 0 < step < self.steps or type(tokens) is not int or tokens < 0 \
                or not isinstance(losses, list) or len(losses) != step \
                or not all(isinstance(x, float) for x in losses):
            return None
        flat, treedef = jax.tree_util.tree_flatten(abstract_state)
        paths = leaf_paths(abstract_state)
        want = {p: (list(x.shape), np.dtype(x.dtype).name) for p, x in zip(paths, flat)}
        have = {tuple(leaf["path"]): leaf for leaf in m["leaves"]}
        if set(have) != set(want) or any([have[p]["shape"], have[p]["dtype"]] != list(want[p]) for p in want):
            return None
        sh = [None] * len(flat) if shardings is None else jax.tree_util.tree_leaves(shardings)
        if len(sh) != len(flat):
            return None
        values = []
        for p, s in zip(paths, sh):
            values.append(jax.device_put(read_leaf(self.path, have[p])) if s is None
                          else load_leaf_sharded(self.path, have[p], s))
        state = jax.tree_util.tree_unflatten(treedef, values)
        if int(jax.device_get(state.step)) != step:
            return None
        return Restored(state, step, [np.float32(x) for x in losses], tokens)

    # ------------------------------------------------------------------ save

    def due(self, step: int) -> bool:
        """Whether to save after ``step`` steps (never after the last: the checkpoint follows).
        Several processes agree on the time trigger (process 0's clock decides)."""
        if step >= self.steps:
            return False
        by_steps = self.every_steps > 0 and step % self.every_steps == 0
        if self.every_minutes <= 0 or by_steps:
            return by_steps
        late = time.monotonic() - self._last >= 60.0 * self.every_minutes
        if jax.process_count() > 1:
            late = bool(multihost_utils.broadcast_one_to_all(np.asarray(late)))
        return late

    def step_done(self, state: Any, step: int, losses: Sequence[Any], tokens: int) -> None:
        """Called after each step with the state, the step count, every loss so far and
        the token count: writes a snapshot when one is due."""
        if self.due(step):
            self.save(state, step, losses, tokens)

    def save(self, state: Any, step: int, losses: Sequence[Any], tokens: int) -> None:
        """Write the snapshot atomically (replacing the previous one); in a multi-process
        run every process takes part in the gathers, process 0 writes."""
        flat = jax.tree_util.tree_leaves(state)
        paths = leaf_paths(state)
        specs = {p: (tuple(x.shape), np.dtype(x.dtype).name) for p, x in zip(paths, flat)}
        host_losses = [float(dist.to_host(x)) for x in losses]
        extra = {"format": FORMAT, "key": self.key, "step": int(step), "losses": host_losses, "tokens": int(tokens)}
        leaves = ((p, dist.to_host(x)) for p, x in zip(paths, flat))
        if dist.is_primary():
            write_checkpoint(self.path, leaves, model_config=self.model_config, tokenizer=self.tokenizer,
                             extra=extra, mp_split=self.mp_split, specs=specs)
        else:
            for _ in leaves:
                pass
        dist.barrier(f"snapshot {self.path} {step}")
        self._last = time.monotonic()
        self.saved += 1

    def discard(self) -> None:
        discard(self.path)


def release(checkpoint: str | Path) -> None:
    """Delete the snapshot of the stage that wrote ``checkpoint``, if one is left: called
    once the run has recorded the checkpoint (every process)."""
    discard(snapshot_dir(checkpoint))


def discard(path: Path) -> None:
    """Delete the snapshot at ``path`` (process 0; all wait). It is first renamed to a
    temporary's name (``.<name>.tmp-...``, which a restarted run cleans away), so that a kill
    during the deletion never leaves a half-deleted snapshot under its own name."""
    if dist.is_primary() and path.exists():
        doomed = temporary_sibling(path, "discard")
        os.rename(path, doomed)
        shutil.rmtree(doomed, ignore_errors=True)
    dist.barrier(f"discard {path}")
