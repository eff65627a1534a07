"""Verifiers: DPO training (``HaikuXmapBackend.train_preferences``) and sequence scoring
(``HaikuXmapBackend.score``).

A sequence's log-probability is the fp32 sum of log p(token | everything before it) over
its completion and the end-of-text token the backend appends: exactly the targets of
``train``'s "completion" loss (``packing.encode_example`` encodes it; ``seq_logp``). A row
holds one sequence (no packing): inputs ``ids[:-1]``, targets ``ids[1:]``, padded to a
bucketed length (``packing.bucket_lengths``), so a row of T tokens scores a sequence of
T + 1 ids; a prompt too long keeps its end (``encode_example``).

DPO (Rafailov et al. 2023, Eq. 7) of a pair (prompt x, chosen c, rejected r):
``z = beta * [(log p(c|x) - log p_ref(c|x)) - (log p(r|x) - log p_ref(r|x))]``, loss
``-log sigmoid(z)``, a step minimising the mean over its pairs (``dpo_objective``, the
objective ``train.make_update`` runs in place of the token loss). The reference is the
frozen ``init``: its log-probabilities are computed once, before the steps, one forward
pass per sequence (``sequence_logps``), and travel in the step's batch (``ref``); the steps
run the policy alone. A step's batch is ``packing.KEYS``' (A, 2R, T) arrays, A =
``grad_accum`` micro-batches of R >= ``batch_size`` pairs (R a multiple of dp), pair i in
rows 2i (chosen) and 2i + 1 (rejected), so a pair never straddles two dp shards, plus
``ref`` (A, 2R, 1). The steps take the pairs in the order of one permutation that the seed
alone draws, cycled (``pair_plan``). With an ``adapter`` table the policy is LoRA adapters
over the frozen ``init`` (merged first when ``init`` is itself adapters), the reference
that base without them; the checkpoint holds the adapters alone (``lora_stage.py``).
"""

from __future__ import annotations

import functools
import math
import os
from pathlib import Path
from typing import Any
from collections.abc import Iterator, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from star_engine import PreferencePair, PreferenceSpec, Progress, TrainExample, TrainResult, TrainSpec, UserError

from ..model import lora
from ..runtime import sharding
from . import trainer as tr
from ..session.distributed import global_array, to_host
from .packing import Encoded, bucket_lengths, empty_batch, encode_example
from ..options import AdamW, ModelOptions, train_config
from ..session.weights import Weights
from .resume import stage_snapshots

KEY = "verifier"  # the TOML section a refusal names


# ----------------------------------------------------------------------------- rows


def encode(tokenizer: Any, prompt: str, completion: str, max_len: int) -> Encoded:
    """``encode_example`` of a sequence scored in a row of at most ``max_len`` tokens
    (``max_len + 1`` ids: the last is only a target); ValueError when the completion
    cannot fit after one prompt token."""
    return encode_example(tokenizer, prompt, completion, max_len + 1)


def fill_rows(encoded: Sequence[Encoded], rows: int, T: int, pad_id: int) -> dict[str, np.ndarray]:
    """(rows, T) arrays of ``packing.KEYS``: sequence j in row j (inputs ``ids[:-1]``, targets
    ``ids[1:]``, weights on the completion and its end-of-text), the rows after them empty."""
    batch = {k: v[0] for k, v in empty_batch(1, rows, T, pad_id).items()}
    for j, e in enumerate(encoded):
        n = len(e.ids) - 1
        batch["tokens"][j, :n] = e.ids[:-1]
        batch["targets"][j, :n] = e.ids[1:]
        batch["weights"][j, max(e.n_prompt, 1) - 1:n] = True  # target t predicts ids[t + 1]
        batch["segments"][j, :n] = 1
        batch["positions"][j, :n] = np.arange(n)
    return batch


def row_length(encoded: Sequence[Encoded], max_len: int) -> int:
    """The bucketed row length (``bucket_lengths(max_len)``) that fits every sequence of ``encoded``."""
    longest = max(len(e.ids) - 1 for e in encoded)
    return next(b for b in bucket_lengths(max_len) if b >= longest)


# ----------------------------------------------------------------------------- log-probabilities


def seq_logp(params: Any, batch: Mapping[str, jax.Array], config: Any, remat: bool = False, adapters: Any = None,
             adapter: lora.LoraSpec | None = None, *, loss_chunk: int | None = None) -> jax.Array:
    """(B,) fp32 sum of log p(target) over each row's weighted targets (``train.token_logp``'s arguments)."""
    logp_BT = tr.token_logp(params, batch, config, remat, adapters, adapter, loss_chunk=loss_chunk)
    return jnp.sum(logp_BT * batch["weights"].astype(jnp.float32), axis=-1)


@functools.partial(jax.jit, static_argnames=("config", "dtype", "loss_chunk"))
def _scored(params: Any, batch: Mapping[str, jax.Array], config: Any, dtype: str,
            loss_chunk: int | None = None) -> jax.Array:
    """``seq_logp`` of ``params`` cast to ``dtype`` (a master copy scored in the compute dtype)."""
    return seq_logp(jax.tree.map(lambda p: p.astype(jnp.dtype(dtype)), params), batch, config, loss_chunk=loss_chunk)


def sequence_logps(params: Any, encoded: Sequence[Encoded], *, rows: int, max_len: int, pad_id: int, config: Any,
                   mesh: Any = None, dtype: str | None = None, progress: Progress | None = None,
                   loss_chunk: int | None = None) -> np.ndarray:
    """fp32 ``seq_logp`` of every sequence of ``encoded``, in its order, under ``params`` (in
    ``dtype``: default ``config.dtype``): ``rows`` sequences a forward pass (rows padded to a
    multiple of dp), taken by length so each pass pads to the smallest bucket that fits.
    ``loss_chunk``: ``train.token_logp``'s (the policy's, so both score alike)."""
    dp = 1 if mesh is None else sharding.dp_size(mesh)
    R = -(-rows // dp) * dp
    row_sh = None if mesh is None else sharding.batch_sharding(mesh, batch_axis=0, ndim=2)
    order = np.argsort([len(e.ids) for e in encoded], kind="stable")
    out_N = np.zeros(len(encoded), np.float32)
    for start in range(0, len(order), rows):
        idx = order[start:start + rows]
        chunk = [encoded[i] for i in idx]
        batch = fill_rows(chunk, R, row_length(chunk, max_len), pad_id)
        if row_sh is not None:
            batch = {k: global_array(v, row_sh) for k, v in batch.items()}
        out_N[idx] = to_host(_scored(params, batch, config, dtype or config.dtype, loss_chunk))[:len(idx)]
        if progress is not None:
            progress(len(idx))
    return out_N


# ----------------------------------------------------------------------------- DPO


def dpo_loss(logp_B: jax.Array, ref_B: jax.Array, valid_P: jax.Array, beta: float) -> tuple[jax.Array, jax.Array]:
    """(sum of -log sigmoid(z) over the valid pairs, their number); rows 2i / 2i + 1 of
    ``logp_B`` (policy) and ``ref_B`` (reference) are pair i's chosen / rejected."""
    margin_P2 = (logp_B - ref_B).reshape(-1, 2)
    z_P = jnp.float32(beta) * (margin_P2[:, 0] - margin_P2[:, 1])
    return -jnp.sum(jax.nn.log_sigmoid(z_P) * valid_P), jnp.sum(valid_P)


def dpo_objective(params: Any, mb: Mapping[str, jax.Array], config: Any, remat: bool = False, adapters: Any = None,
                  adapter: lora.LoraSpec | None = None, *, beta: float,
                  loss_chunk: int | None = None, loss_tokens: int | None = None,
                  loss_dot_dtype: str | None = None) -> tuple[jax.Array, jax.Array]:
    """``train.make_update``'s objective for one DPO micro-batch (rows as ``dpo_loss``'s,
    ``ref`` (2R, 1)): a pair is real when its chosen row carries loss (dp padding does not).
    ``loss_tokens`` and ``loss_dot_dtype`` are not used: the loss is not linear in each token's
    log-probability, so its output layer is ``loss_chunk``'s, in the weights' dtype (as the
    reference scoring's, ``score_sequences``)."""
    valid_P = jnp.any(mb["weights"][0::2], axis=-1).astype(jnp.float32)
    logp_B = seq_logp(params, mb, config, remat, adapters, adapter, loss_chunk=loss_chunk)
    return dpo_loss(logp_B, mb["ref"][:, 0], valid_P, beta)


def pair_plan(n_pairs: int, *, steps: int, per_step: int, seed: int) -> list[np.ndarray]:
    """The pair indices of each step: one permutation drawn from ``seed``, cycled."""
    perm = np.random.default_rng(seed).permutation(n_pairs)
    return [perm[np.arange(s * per_step, (s + 1) * per_step) % n_pairs] for s in range(steps)]


def dpo_batches(seqs: Sequence[Encoded], ref_N: np.ndarray, plan: Sequence[np.ndarray], *, batch_size: int,
                grad_accum: int, max_len: int, pad_id: int, dp: int = 1) -> Iterator[dict[str, np.ndarray]]:
    """The host batches of the steps of ``plan``: ``seqs`` / ``ref_N`` hold pair i's chosen at
    2i and rejected at 2i + 1; micro-batch a takes the step's pairs [a B, (a + 1) B)."""
    R = -(-batch_size // dp) * dp
    for idx in plan:
        step = [seqs[2 * i + k] for i in idx for k in (0, 1)]
        T = row_length(step, max_len)
        micro = []
        for a in range(grad_accum):
            rows = [2 * i + k for i in idx[a * batch_size:(a + 1) * batch_size] for k in (0, 1)]
            mb = fill_rows([seqs[r] for r in rows], 2 * R, T, pad_id)
            mb["ref"] = np.zeros((2 * R, 1), np.float32)
            mb["ref"][:len(rows), 0] = ref_N[rows]
            micro.append(mb)
        yield {k: np.stack([mb[k] for mb in micro]) for k in micro[0]}


# ----------------------------------------------------------------------------- backend methods


def encode_pairs(tokenizer: Any, pairs: Sequence[PreferencePair], max_len: int) -> list[Encoded]:
    """Pair i's chosen and rejected sequences at 2i and 2i + 1; a completion that does not
    fit ``max_len`` (``model.seq_len``) after its prompt is a UserError naming ``verifier``."""
    seqs = []
    for i, pair in enumerate(pairs):
        for which in ("chosen", "rejected"):
            completion = getattr(pair, which)
            try:
                seqs.append(encode(tokenizer, pair.prompt, completion, max_len))
            except ValueError:
                n = len(tokenizer.encode(completion)) + 1
                raise UserError(f"{KEY}: pair {i}: its {which} completion of {n} tokens (with end-of-text) does "
                                f"not fit the training length of {max_len} tokens (model.seq_len) after its prompt: "
                                f"{completion[:60]!r}...", key=KEY) from None
    return seqs


def train_preferences(weights: Weights, options: ModelOptions, init: str, out: Path, pairs: Sequence[PreferencePair],
                      spec: PreferenceSpec, progress: Progress | None = None) -> TrainResult:
    """``HaikuXmapBackend.train_preferences`` (see the module docstring): the checkpoint is
    ``train``'s (master weights; ``extra.kind = "verifier"``) or, with an adapter table, a
    LoRA stage's (``extra.kind = "lora"``, its base ``init``); ``extra.stage = "verifier"``. ``weights``:
    the backend's; ``options``: its ``[model]`` table."""
    if spec.steps > 0 and not pairs:
        raise UserError(f"{KEY}: {spec.steps} steps requested but there are no preference pairs", key=KEY)
    if not (math.isfinite(spec.beta) and spec.beta > 0):
        raise UserError(f"{KEY}.beta: must be a number > 0, got {spec.beta!r}", key=f"{KEY}.beta")
    optimizer = AdamW.from_table(spec.optimizer, f"{KEY}.optimizer")  # a table is checked here, naming its key
    want = None if spec.adapter is None else lora.check_table(spec.adapter, weights.config, f"{KEY}.adapter")
    tspec = TrainSpec(spec.steps, spec.batch_size, spec.grad_accum, spec.seed, spec.optimizer, packing="none",
                      loss="completion", adapter=spec.adapter)
    job = train_config(options, weights.model, tspec, want, optimizer)
    seqs = encode_pairs(weights.tokenizer, pairs, weights.seq_len)
    snapshots = stage_snapshots(weights, options, init, out, tspec, seqs, {"kind": "dpo", "beta": float(spec.beta)})
    mesh, config, pad_id = weights.mesh, weights.config, weights.tokenizer.pad_id
    # The loaded weights: the frozen base (compute dtype) under adapters, else the policy's
    # start in the master dtype (the one list holds the only reference: the trainer's master
    # copy replaces it).
    held = [weights.load(init) if want is not None else weights.load(init, options.master_dtype, keep=False)]
    batches = None
    if spec.steps > 0:
        ref_N = sequence_logps(held[0], seqs, rows=2 * spec.batch_size, max_len=weights.seq_len, pad_id=pad_id,
                               config=config, mesh=mesh, loss_chunk=job.loss_chunk)
        plan = pair_plan(len(pairs), steps=spec.steps, per_step=spec.batch_size * spec.grad_accum, seed=spec.seed)
        batches = dpo_batches(seqs, ref_N, plan, batch_size=spec.batch_size, grad_accum=spec.grad_accum,
                              max_len=weights.seq_len, pad_id=pad_id, dp=sharding.dp_size(mesh))
    frozen = held[0] if want is not None else None
    trained, losses, tokens = tr.train(held.pop(), config, seqs, job, mesh=mesh,
                                       progress=progress, snapshots=snapshots, batches=batches,
                                       objective=functools.partial(dpo_objective, beta=float(spec.beta)))
    out.parent.mkdir(parents=True, exist_ok=True)
    init_id = weights.checkpoint_id(init)
    extra = {"stage": "verifier", "objective": "dpo", "init": init_id, "beta": float(spec.beta),
             "steps": spec.steps, "seed": spec.seed, "batch_size": spec.batch_size, "grad_accum": spec.grad_accum,
             "pairs": len(pairs), "compute_dtype": config.dtype}
    if want is not None:
        ckpt_id = weights.keep_written(
            out, trained, {"kind": "lora", "lora": want.to_dict(), "base": init_id,
                           "base_path": os.path.relpath(Path(init).resolve(), out.resolve()), **extra},
            specs=lora.adapter_specs(config, want), compute=lora.merge(frozen, trained, want, config.dtype))
    else:
        ckpt_id = weights.keep_written(out, trained, {"kind": "verifier", **extra},
                                        dtype=str(jax.tree.leaves(trained)[0].dtype))
    del trained, frozen
    return TrainResult(checkpoint=str(out), checkpoint_id=ckpt_id, steps=spec.steps, tokens=tokens,
                       losses=tuple(losses))


def score(weights: Weights, checkpoint: str, examples: Sequence[TrainExample], batch_size: int,
          progress: Progress | None = None) -> list[float]:
    """``HaikuXmapBackend.score``: each example's fp32 log-probability (completion and
    end-of-text) under ``checkpoint`` loaded as ``generate`` loads it, ``batch_size`` rows a
    pass; a prompt too long for the context (``model.n_ctx``) keeps its end."""
    if not examples:
        return []
    n_ctx, seqs = weights.config.n_ctx, []
    for i, ex in enumerate(examples):
        try:
            seqs.append(encode(weights.tokenizer, ex.prompt, ex.completion, n_ctx))
        except ValueError:
            raise UserError(f"{KEY}: scored example {i}: its completion does not fit the model's context of "
                            f"n_ctx = {n_ctx} tokens after its prompt: {ex.completion[:60]!r}...", key=KEY) from None
    logp_N = sequence_logps(weights.load(checkpoint), seqs, rows=batch_size, max_len=n_ctx,
                            pad_id=weights.tokenizer.pad_id, config=weights.config, mesh=weights.mesh,
                            progress=progress)
    return [float(x) for x in logp_N]
