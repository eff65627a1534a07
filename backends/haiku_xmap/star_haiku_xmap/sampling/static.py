"""Batched sampling with a KV cache: one prefill, then ``lax.while_loop``s of
one-token decode steps (no Python loop per token), the cache growing between
a few phases so that early steps do not attend to empty slots.

Prompts are left-padded so every row's next token lands in the same cache slot;
positions skip the padding, so a row decodes exactly as it would alone. Each
row has its own RNG key, folded with the step index, so a sampled row depends
on its own seed only, never on its batch mates.
"""

from __future__ import annotations

import functools
from typing import Any, cast
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from ..model import network as model
from ..runtime import hostcopy, sharding
from ..session import distributed as dist
from ..train.packing import bucket_lengths
from ..model.config import GPTJConfig
from ..options import DecodeConfig


def keys_from_seeds(seeds: Sequence[int]) -> jax.Array:
    """One typed PRNG key per row from arbitrary Python ints (64 bits are used)."""
    s = np.asarray([int(x) & 0xFFFF_FFFF_FFFF_FFFF for x in seeds], dtype=np.uint64)
    lo = (s & np.uint64(0xFFFF_FFFF)).astype(np.uint32)
    hi = (s >> np.uint64(32)).astype(np.uint32)
    return jax.vmap(lambda a, b: jax.random.fold_in(jax.random.key(a), b))(lo, hi)


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int, length: int | None = None,
             rows: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(tokens (B, T) int32, mask (B, T) bool) with each prompt flush right.

    ``length`` pads T beyond the longest prompt (to reuse a compiled shape),
    ``rows`` adds all-padding rows (their output is meaningless)."""
    T = max([len(p) for p in prompts] + [1]) if length is None else length
    B = len(prompts) if rows is None else rows
    if any(len(p) > T for p in prompts) or B < len(prompts):
        raise ValueError(f"left_pad: prompts do not fit ({B} rows x {T} tokens)")
    tokens = np.full((B, T), pad_id, np.int32)
    mask = np.zeros((B, T), bool)
    for b, p in enumerate(prompts):
        if len(p):
            tokens[b, T - len(p):] = p
            mask[b, T - len(p):] = True
    return tokens, mask


def first_argmax(x_BV: jax.Array) -> jax.Array:
    """``jnp.argmax`` over the last axis (int32): the first index of the largest value, or of
    the first NaN when there is one. Two plain reductions (the maximum, then the smallest
    index that holds it) instead of XLA's variadic (value, index) reduce, which XLA:CPU runs
    about 2x slower at a vocabulary of 50,400 (docs/performance.md §3.6)."""
    m_B1 = jnp.max(x_BV, axis=-1, keepdims=True)  # XLA:CPU's max may skip a NaN: its own test below
    nan_BV = jnp.isnan(x_BV)
    hit_BV = jnp.where(jnp.any(nan_BV, axis=-1, keepdims=True), nan_BV, x_BV == m_B1)
    V = x_BV.shape[-1]
    return jnp.min(jnp.where(hit_BV, jnp.arange(V, dtype=jnp.int32), V), axis=-1)


def sample_logits(logits_BV: jax.Array, keys_B: jax.Array, step, temperature, top_p) -> jax.Array:
    """Next tokens (B,): argmax when ``temperature == 0``, else temperature then
    nucleus (top-p) sampling with each row's key folded with ``step``: the index
    of the token being drawn, one for every row or a (B,) array (each row's own
    token index, when rows started at different times)."""
    def greedy(_):
        return first_argmax(logits_BV)

    def nucleus(scaled_BV):
        sorted_BV = jnp.sort(scaled_BV, axis=-1)[:, ::-1]
        probs_BV = jax.nn.softmax(sorted_BV, axis=-1)
        # Keep the smallest prefix whose mass reaches top_p (the top token always stays).
        before_BV = jnp.cumsum(probs_BV, axis=-1) - probs_BV
        n_keep_B = jnp.maximum(jnp.sum(before_BV < top_p, axis=-1), 1)
        cutoff_B = jnp.take_along_axis(sorted_BV, (n_keep_B - 1)[:, None], axis=-1)
        return jnp.where(scaled_BV >= cutoff_B, scaled_BV, -jnp.inf)

    def sampled(_):
        scaled_BV = logits_BV.astype(jnp.float32) / temperature
        # top_p >= 1 keeps every token (as HF's TopPLogitsWarper, which is not applied then):
        # no sort over the vocabulary (at 50,400 tokens the sort was most of a sampled step)
        masked_BV = jax.lax.cond(top_p < 1, nucleus, lambda x: x, scaled_BV)
        row_keys = jax.vmap(jax.random.fold_in, in_axes=(0, 0 if jnp.ndim(step) else None))(keys_B, step)
        return jax.vmap(jax.random.categorical)(row_keys, masked_BV).astype(jnp.int32)

    return jax.lax.cond(temperature > 0, sampled, greedy, None)


@functools.partial(jax.jit, static_argnames=("config", "max_new_tokens", "eos_id", "valid_vocab", "mesh"))
def generate(params, tokens_BT: jax.Array, mask_BT: jax.Array, keys_B: jax.Array, temperature, top_p, *,
             config: GPTJConfig, max_new_tokens: int, eos_id: int, valid_vocab: int | None = None,
             mesh: Mesh | None = None, budget_B: jax.Array | None = None) -> jax.Array:
    """New tokens (B, max_new_tokens) for left-padded prompts; after a row's
    end-of-text (included) the rest of the row is end-of-text. The loop stops
    early once every row has finished. Every row needs at least one real token.
    ``budget_B`` (optional, (B,) int): row b ends after that many tokens (at
    most ``max_new_tokens``); the batch still runs until its last row ends.

    ``valid_vocab``: ids at or above it (the padding rows of a padded vocabulary,
    never trained) are never produced. ``mesh``: rows split over its "dp" axis
    (B a multiple of its size); each dp shard then runs its own decode loop
    ("mp" stays automatic), so shards never synchronise per token and each
    stops once its own rows have finished."""
    rows = functools.partial(_generate_rows, config=config, max_new_tokens=max_new_tokens, eos_id=eos_id,
                             valid_vocab=valid_vocab, mesh=mesh)
    if budget_B is None:
        budget_B = jnp.full(tokens_BT.shape[:1], max_new_tokens, jnp.int32)
    args = (params, tokens_BT, mask_BT, keys_B, budget_B, temperature, top_p)
    if mesh is None or mesh.shape["dp"] == 1:
        return rows(*args)
    return jax.shard_map(rows, mesh=mesh, in_specs=(P(),) + (P("dp"),) * 4 + (P(), P()), out_specs=P("dp"),
                         axis_names={"dp"}, check_vma=False)(*args)


def mask_vocab(logits_BV: jax.Array, valid_vocab: int | None, mesh: Mesh | None = None) -> jax.Array:
    """Logits with the ids at or above ``valid_vocab`` (never trained) set to
    -inf, whole on every device of an "mp" group (inside a dp shard's loop): the
    sampler's sort and reversal then need no collectives, whose XLA:CPU
    rendezvous span every device and would tie the shards' loops together."""
    if mesh is not None and mesh.shape["mp"] > 1:
        whole = P() if mesh.shape["dp"] > 1 else NamedSharding(mesh, P())
        logits_BV = jax.lax.with_sharding_constraint(logits_BV, whole)
    if valid_vocab is None or valid_vocab >= logits_BV.shape[-1]:
        return logits_BV
    return jnp.where(jnp.arange(logits_BV.shape[-1]) < valid_vocab, logits_BV, -jnp.inf)


def lockstep(mesh: Mesh | None) -> bool:
    """True when the dp shards' decode loops must run the same number of steps:
    their bodies hold "mp" collectives (mp > 1) and the devices are XLA:CPU's,
    whose in-process rendezvous wait for every device of the program."""
    return (mesh is not None and mesh.shape["dp"] > 1 and mesh.shape["mp"] > 1
            and sharding.needs_serial_steps(mesh))


def any_shard(flag: jax.Array, mesh: Mesh | None) -> jax.Array:
    """``flag`` or'ed over the dp shards when they run in ``lockstep``, else as it is."""
    return jax.lax.psum(flag.astype(jnp.int32), "dp") > 0 if lockstep(mesh) else flag


def _generate_rows(params, tokens_BT, mask_BT, keys_B, budget_B, temperature, top_p, *, config: GPTJConfig,
                   max_new_tokens: int, eos_id: int, valid_vocab: int | None, mesh: Mesh | None) -> jax.Array:
    B, T = tokens_BT.shape
    N = max_new_tokens
    temperature = jnp.asarray(temperature, jnp.float32)
    top_p = jnp.asarray(top_p, jnp.float32)
    ends = _phase_ends(T, N)
    logits_BV, cache, key_mask_BS = model.prefill(params, tokens_BT, mask_BT, config, T + ends[0])
    next_pos_B = jnp.sum(mask_BT, axis=1, dtype=jnp.int32)  # a row's next position = its prompt length

    def body(s):
        i, logits_BV, cache, key_mask_BS, out_BN, done_B = s
        logits_BV = mask_vocab(logits_BV, valid_vocab, mesh)
        tok_B = jnp.where(done_B, eos_id, sample_logits(logits_BV, keys_B, i, temperature, top_p))
        out_BN = jax.lax.dynamic_update_slice(out_BN, tok_B[:, None], (0, i))
        done_B = done_B | (tok_B == eos_id) | (i + 1 >= budget_B)
        logits_BV, cache, key_mask_BS = model.decode_step(params, tok_B, next_pos_B + i, T + i, cache,
                                                          key_mask_BS, config)
        return i + 1, logits_BV, cache, key_mask_BS, out_BN, done_B

    state = (jnp.zeros((), jnp.int32), logits_BV, cache, key_mask_BS, jnp.full((B, N), eos_id, jnp.int32),
             jnp.zeros((B,), bool))
    for j, end in enumerate(ends):
        if j:  # grow the cache (and its key mask) to this phase's length
            grow = end - ends[j - 1]
            i, logits_BV, cache, key_mask_BS, out_BN, done_B = state
            cache = model.KVCache(*(tuple(jnp.pad(x, ((0, 0), (0, 0), (0, grow), (0, 0))) for x in xs)
                                    for xs in cache))
            state = (i, logits_BV, cache, jnp.pad(key_mask_BS, ((0, 0), (0, grow))), out_BN, done_B)
        state = jax.lax.while_loop(  # (cast: mypy infers no lambda with a default argument)
            cast(Callable[[Any], Any], lambda s, end=end: (s[0] < end) & any_shard(~jnp.all(s[5]), mesh)), body, state)
    return state[4]


def _phase_ends(prompt_len: int, n_new: int) -> list[int]:
    """Decode steps at which the cache grows. A step attends every slot of its
    cache, so growing it in phases (instead of prompt + n_new slots from the
    start) saves about n_new / 2 x (1 - 1 / phases) slots per step: a fifth of
    the attention reads at 64 + 96 tokens. Each phase compiles one more loop
    body and briefly holds two caches, so short generations after long prompts
    (a few per cent to gain) keep one phase."""
    phases = max(1, min(4, n_new // 16)) if n_new >= prompt_len else 1
    return [n_new * (j + 1) // phases for j in range(phases)]


def generate_batches(params, prompts: Sequence[Sequence[int]], seeds: Sequence[int], budgets: Sequence[int], *,
                     config: GPTJConfig, decode: DecodeConfig, mesh: Mesh | None = None,
                     progress: Callable[[int], None] | None = None) -> list[list[int]]:
    """The static path: prompts sorted by length, ``decode.slots`` at a time (rounded up
    to a multiple of dp), left-padded to a length bucket and run by ``generate``
    until the batch's last row ends. Same arguments and results as
    ``continuous.generate`` (new tokens, end-of-text not included); stop strings
    are the caller's to apply. The largest budget fixes the compiled loop length and the
    prompt buckets below n_ctx."""
    N = max(budgets, default=0)
    slots, eos_id, pad_id = decode.slots, decode.eos_id, decode.pad_id
    results: list[list[int]] = [[] for _ in prompts]
    if not prompts or N == 0:
        if progress is not None and prompts:
            progress(len(prompts))
        return results
    mesh = mesh if mesh is not None else sharding.make_mesh({"dp": 1, "mp": 1}, jax.devices()[:1])
    params = hostcopy.shared(params)  # one copy of the replicated weights for all CPU devices
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # similar lengths share a batch
    dp = sharding.dp_size(mesh)
    rows = -(-slots // dp) * dp
    buckets = bucket_lengths(config.n_ctx - N)
    rows_sh = sharding.batch_sharding(mesh)
    vec_sh = sharding.batch_sharding(mesh, ndim=1)
    keys_data_sh = sharding.batch_sharding(mesh, ndim=2)
    put = (lambda x, sh: dist.global_array(x, sh)) if jax.process_count() > 1 else jax.device_put
    for start in range(0, len(order), slots):
        group = order[start:start + slots]
        T = next(b for b in buckets if b >= max(len(prompts[i]) for i in group))
        batch = [prompts[i] for i in group] + [[eos_id if eos_id >= 0 else pad_id]] * (rows - len(group))
        tokens_BT, mask_BT = left_pad(batch, pad_id, length=T)
        key_data = np.asarray(jax.random.key_data(keys_from_seeds([seeds[i] for i in group] + [0] * (rows - len(group)))))
        budget_B = np.asarray([budgets[i] for i in group] + [1] * (rows - len(group)), np.int32)
        out_BN = generate(params, put(tokens_BT, rows_sh), put(mask_BT, rows_sh),
                          jax.random.wrap_key_data(put(key_data, keys_data_sh)), float(decode.temperature),
                          float(decode.top_p), config=config, max_new_tokens=N, eos_id=eos_id,
                          valid_vocab=decode.valid_vocab, mesh=mesh,
                          budget_B=put(budget_B, vec_sh))
        out_BN = dist.to_host(out_BN)
        for row, i in enumerate(group):
            results[i] = trim(out_BN[row, :budgets[i]], eos_id)
        if progress is not None:
            progress(len(group))
    return results


def trim(tokens_N: Sequence[int] | np.ndarray, eos_id: int) -> list[int]:
    """A row's tokens before its first end-of-text."""
    out = []
    for t in tokens_N:
        if int(t) == eos_id:
            break
        out.append(int(t))
    return out
