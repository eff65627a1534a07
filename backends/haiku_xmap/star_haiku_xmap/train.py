"""Fine-tuning: AdamW with warmup + anneal, masked cross-entropy, gradient
accumulation inside one jit'd step, length-bucketed deterministic batches.

A batch is three arrays of shape (A, B, T): A accumulation micro-batches of B
sequences, right-padded to a bucket length T. ``loss_mask`` marks the tokens that
carry loss (the completion and its end-of-text); token t is predicted from t-1.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from . import model, sharding
from .config import GPTJConfig

OPTIMIZER_DEFAULTS: dict[str, Any] = {
    "lr": 1e-4, "warmup_steps": 0, "schedule": "constant", "end_lr": None,
    "weight_decay": 0.0, "clip_norm": 1.0, "b1": 0.9, "b2": 0.999,
}
SCHEDULES = ("constant", "linear", "cosine")


class TrainState(NamedTuple):
    params: Any
    opt_state: Any
    step: jax.Array  # int32 scalar: optimizer steps taken


class Encoded(NamedTuple):
    ids: np.ndarray  # int32 (n,): prompt + completion + end-of-text
    n_prompt: int  # the first n_prompt ids carry no loss


# ----------------------------------------------------------------------------- optimizer


def optimizer_options(opt: Mapping[str, Any]) -> dict[str, Any]:
    """The TOML optimizer table with defaults filled in and values checked (ValueError)."""
    unknown = sorted(set(opt) - set(OPTIMIZER_DEFAULTS))
    if unknown:
        raise ValueError(f"unknown optimizer keys {unknown}; allowed: {sorted(OPTIMIZER_DEFAULTS)}")
    o = {**OPTIMIZER_DEFAULTS, **opt}
    if o["end_lr"] is None:
        o["end_lr"] = o["lr"]
    for key in ("lr", "end_lr", "weight_decay", "clip_norm", "b1", "b2"):
        v = o[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v) or v < 0:
            raise ValueError(f"optimizer.{key} must be a finite number >= 0, got {v!r}")
        o[key] = float(v)
    for key in ("b1", "b2"):
        if not o[key] < 1:
            raise ValueError(f"optimizer.{key} must be < 1, got {o[key]}")
    if isinstance(o["warmup_steps"], bool) or not isinstance(o["warmup_steps"], int) or o["warmup_steps"] < 0:
        raise ValueError(f"optimizer.warmup_steps must be an int >= 0, got {o['warmup_steps']!r}")
    if o["schedule"] not in SCHEDULES:
        raise ValueError(f"optimizer.schedule must be one of {SCHEDULES}, got {o['schedule']!r}")
    return o


def make_schedule(opt: Mapping[str, Any], total_steps: int) -> optax.Schedule:
    """Linear warmup 0 -> lr over warmup_steps, then constant lr or a linear/cosine
    anneal to end_lr at ``total_steps``."""
    o = optimizer_options(opt)
    lr, end_lr, warmup = o["lr"], o["end_lr"], o["warmup_steps"]
    decay_steps = max(1, total_steps - warmup)
    if o["schedule"] == "constant":
        after = optax.constant_schedule(lr)
    elif o["schedule"] == "linear":
        after = optax.linear_schedule(lr, end_lr, decay_steps)
    elif lr > 0:
        after = optax.cosine_decay_schedule(lr, decay_steps, alpha=end_lr / lr)
    else:
        after = optax.constant_schedule(0.0)
    if warmup == 0:
        return after
    return optax.join_schedules([optax.linear_schedule(0.0, lr, warmup), after], [warmup])


def make_optimizer(opt: Mapping[str, Any], total_steps: int) -> optax.GradientTransformation:
    """Global-norm clipping (clip_norm 0 = off), then AdamW. Weight decay applies to
    matrices only (LayerNorms and biases are not decayed)."""
    o = optimizer_options(opt)
    adamw = optax.adamw(make_schedule(o, total_steps), b1=o["b1"], b2=o["b2"], eps=1e-8,
                        weight_decay=o["weight_decay"],
                        mask=lambda p: jax.tree.map(lambda x: x.ndim >= 2, p))
    if o["clip_norm"] > 0:
        return optax.chain(optax.clip_by_global_norm(o["clip_norm"]), adamw)
    return adamw


def init_state(params: Any, tx: optax.GradientTransformation) -> TrainState:
    # Moments in fp32 even for bf16 params: bf16 second moments underflow.
    return TrainState(params, tx.init(jax.tree.map(lambda p: p.astype(jnp.float32), params)),
                      jnp.zeros((), jnp.int32))


# ----------------------------------------------------------------------------- loss / step


def token_loss(params, tokens_BT, mask_BT, loss_mask_BT, config: GPTJConfig):
    """(sum of fp32 next-token NLL over loss tokens, number of loss tokens)."""
    logits_BTV = model.forward(params, tokens_BT, config, mask=mask_BT)
    # Position t predicts token t + 1; the last position gets weight 0 (and a dummy
    # target) instead of slicing the logits, whose gradient would be a padded copy.
    # log p(target) = (x - max)[target] - log sum exp(x - max), as log_softmax
    # computes it; the one-hot product picks the target exactly, and its gradient
    # stays elementwise (take_along_axis's would be a scatter).
    target_BT = jnp.concatenate([tokens_BT[:, 1:], jnp.zeros_like(tokens_BT[:, :1])], axis=1)
    w_BT = jnp.concatenate([loss_mask_BT[:, 1:], jnp.zeros_like(loss_mask_BT[:, :1])], axis=1).astype(jnp.float32)
    shifted_BTV = logits_BTV - jax.lax.stop_gradient(jnp.max(logits_BTV, axis=-1, keepdims=True))
    onehot_BTV = jax.nn.one_hot(target_BT, logits_BTV.shape[-1], dtype=jnp.float32)
    logp_BT = jnp.sum(shifted_BTV * onehot_BTV, axis=-1) - jnp.log(jnp.sum(jnp.exp(shifted_BTV), axis=-1))
    return -jnp.sum(logp_BT * w_BT), jnp.sum(w_BT)


def make_update(config: GPTJConfig, tx: optax.GradientTransformation, mesh=None,
                state_example: TrainState | None = None, state_shardings: Any = None) -> Callable:
    """``update(state, batch) -> (state, metrics)``, jit'd with the state donated.

    Gradients of the summed loss are accumulated over the A micro-batches with a
    scan and divided by the total loss-token count, so the step minimises the
    per-token mean over every loss token of the step (not a mean of means).
    With a mesh, ``state_example`` fixes the state's shardings (rule table) and
    the batch is split over "dp" on its B axis.
    """
    grad_fn = jax.value_and_grad(lambda p, t, m, lm: token_loss(p, t, m, lm, config), has_aux=True)

    def update(state: TrainState, batch: Mapping[str, jax.Array]):
        def micro(carry, mb):
            g_acc, loss_acc, n_acc = carry
            (loss_sum, n), g = grad_fn(state.params, mb["tokens"], mb["mask"], mb["loss_mask"])
            g_acc = jax.tree.map(lambda a, b: a + b.astype(jnp.float32), g_acc, g)
            return (g_acc, loss_acc + loss_sum, n_acc + n), None

        zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), state.params)
        scalar = jnp.zeros((), jnp.float32)
        (g_sum, loss_sum, n), _ = jax.lax.scan(micro, (zeros, scalar, scalar), batch)
        denom = jnp.maximum(n, 1.0)
        grads = jax.tree.map(lambda g: g / denom, g_sum)
        updates, opt_state = tx.update(grads, state.opt_state,
                                       jax.tree.map(lambda p: p.astype(jnp.float32), state.params))
        params = jax.tree.map(lambda p, u: (p.astype(jnp.float32) + u).astype(p.dtype), state.params, updates)
        metrics = {"loss": loss_sum / denom, "tokens": n, "grad_norm": optax.tree.norm(grads)}
        return TrainState(params, opt_state, state.step + 1), metrics

    if mesh is None:
        return jax.jit(update, donate_argnums=0)
    if state_example is None and state_shardings is None:
        raise ValueError("make_update: a mesh needs state_example to derive the state shardings")
    # state_shardings (optional): the state's shardings as given, e.g. ZeRO-1's (distributed.py)
    state_sh = sharding.tree_shardings(state_example, mesh) if state_shardings is None else state_shardings
    batch_sh = sharding.batch_sharding(mesh, batch_axis=1, ndim=3)
    return jax.jit(update, in_shardings=(state_sh, batch_sh), out_shardings=(state_sh, sharding.replicated(mesh)),
                   donate_argnums=0)


# ----------------------------------------------------------------------------- data


def encode_example(tokenizer, prompt: str, completion: str, seq_len: int) -> Encoded:
    """Token ids of prompt + completion + end-of-text, at most ``seq_len`` long.

    Prompt and completion are encoded separately (generation sees the prompt
    alone, so its tokens must not merge with the completion's). Too long: the
    prompt loses tokens from its left (one is kept to predict the completion's
    first token); a completion that cannot fit raises ValueError.
    """
    p = tokenizer.encode(prompt)
    c = tokenizer.encode(completion) + [tokenizer.eos_id]
    keep_prompt = min(len(p), max(seq_len - len(c), 0))
    if len(c) + (1 if p else 0) > seq_len:
        raise ValueError(f"completion of {len(c)} tokens (with end-of-text) does not fit seq_len={seq_len} "
                         f"after its prompt; raise seq_len or shorten the completion: {completion[:60]!r}...")
    ids = p[len(p) - keep_prompt:] + c
    return Encoded(np.asarray(ids, np.int32), keep_prompt)


def bucket_lengths(seq_len: int, smallest: int = 16) -> list[int]:
    """Powers of two from ``smallest`` below seq_len, then seq_len itself."""
    out, n = [], smallest
    while n < seq_len:
        out.append(n)
        n *= 2
    return out + [seq_len]


def plan_steps(lengths: Sequence[int], *, steps: int, per_step: int, seed: int,
               window: int = 8) -> list[np.ndarray]:
    """Example indices for each optimizer step, deterministic in ``seed``.

    Indices come from a stream of seeded permutations (epoch after epoch). Every
    ``window`` steps' worth is sorted by length and cut into steps whose order is
    then shuffled, so a step holds similar lengths and pads to a short bucket.
    """
    if not lengths:
        raise ValueError("no training examples")
    rng = np.random.default_rng(seed)
    lengths = np.asarray(lengths)
    stream: list[int] = []
    plan: list[np.ndarray] = []
    while len(plan) < steps:
        n_steps = min(window, steps - len(plan))
        while len(stream) < n_steps * per_step:
            stream.extend(rng.permutation(len(lengths)).tolist())
        chunk = np.asarray(stream[:n_steps * per_step])
        del stream[:n_steps * per_step]
        chunk = chunk[np.argsort(lengths[chunk], kind="stable")]
        groups = chunk.reshape(n_steps, per_step)
        plan.extend(groups[rng.permutation(n_steps)])
    return plan


def collate(encoded: Sequence[Encoded], idx: np.ndarray, *, grad_accum: int, batch_size: int,
            buckets: Sequence[int], pad_id: int, row_multiple: int = 1) -> dict[str, np.ndarray]:
    """(A, B, T) arrays for one step; B is padded with loss-free rows to a multiple of
    ``row_multiple`` (the dp size) and T to the smallest bucket that fits."""
    longest = max(len(encoded[i].ids) for i in idx)
    T = next(b for b in buckets if b >= longest)
    B = -(-batch_size // row_multiple) * row_multiple
    tokens = np.full((grad_accum, B, T), pad_id, np.int32)
    mask = np.zeros((grad_accum, B, T), bool)
    loss_mask = np.zeros((grad_accum, B, T), bool)
    for j, i in enumerate(idx):
        a, b = divmod(j, batch_size)
        ids, n_prompt = encoded[i]
        tokens[a, b, :len(ids)] = ids
        mask[a, b, :len(ids)] = True
        loss_mask[a, b, n_prompt:len(ids)] = True
    return {"tokens": tokens, "mask": mask, "loss_mask": loss_mask}


def train(params: Any, config: GPTJConfig, encoded: Sequence[Encoded], *, steps: int, batch_size: int,
          grad_accum: int, seed: int, optimizer: Mapping[str, Any], seq_len: int, pad_id: int,
          mesh=None, progress: Callable[[int], None] | None = None) -> tuple[Any, list[float], int]:
    """Run ``steps`` optimizer steps from ``params`` (left intact). Returns (params,
    per-step losses, number of loss tokens). Each step takes batch_size x grad_accum
    examples; with a mesh the state is sharded by the rule table."""
    if steps < 0 or batch_size < 1 or grad_accum < 1:
        raise ValueError(f"bad training shape: steps={steps} batch_size={batch_size} grad_accum={grad_accum}")
    if steps == 0:
        return params, [], 0
    tx = make_optimizer(optimizer, steps)
    if mesh is not None:
        params = sharding.shard_tree(params, mesh)
    # The update donates its state; copy so the caller's arrays (e.g. a cache) survive.
    params = jax.tree.map(jnp.copy, params)
    state = init_state(params, tx)
    update = make_update(config, tx, mesh, state)
    state, metrics, n_tokens = run_steps(update, state, encoded, steps=steps, batch_size=batch_size,
                                         grad_accum=grad_accum, seed=seed, seq_len=seq_len, pad_id=pad_id,
                                         mesh=mesh, progress=progress)
    losses = [float(x) for x in jax.device_get(metrics)]
    return state.params, losses, n_tokens


def run_steps(update: Callable, state: TrainState, encoded: Sequence[Encoded], *, steps: int, batch_size: int,
              grad_accum: int, seed: int, seq_len: int, pad_id: int, mesh=None,
              put: Callable[[dict], dict] = lambda batch: batch,
              progress: Callable[[int], None] | None = None) -> tuple[TrainState, list, int]:
    """The step loop of ``train`` and ``distributed.train``: plan, collate, update.

    ``put`` places a host batch on the devices (multi-process runs build global
    arrays). Returns (state, per-step loss arrays, number of loss tokens)."""
    buckets = bucket_lengths(seq_len)
    rows = 1 if mesh is None else sharding.dp_size(mesh)
    plan = plan_steps([len(e.ids) for e in encoded], steps=steps, per_step=batch_size * grad_accum, seed=seed)
    metrics, n_tokens = [], 0
    serial = sharding.needs_serial_steps(mesh)
    for idx in plan:
        batch = collate(encoded, idx, grad_accum=grad_accum, batch_size=batch_size, buckets=buckets,
                        pad_id=pad_id, row_multiple=rows)
        n_tokens += int(batch["loss_mask"][:, :, 1:].sum())
        state, m = update(state, put(batch))
        if serial:  # overlapping steps' all-reduces deadlock XLA:CPU's in-process rendezvous
            jax.block_until_ready(m["loss"])
        metrics.append(m["loss"])
        if progress is not None:
            progress(1)
    return state, metrics, n_tokens
