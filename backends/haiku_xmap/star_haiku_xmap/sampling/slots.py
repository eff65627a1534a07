"""The device side of continuous batching (``continuous.py`` schedules it): the slots'
state and the compiled programs that change it, no Python per token.

- ``empty``: slots with an empty cache; ``resize``: the same slots with a longer or shorter
  cache (rows start at cache slot 0, so cutting keeps every row that fits).
- ``compact``: the live rows gathered into fewer slots (once no prompt waits, the last
  rows decode without the ended ones' slots: a row's tokens do not depend on its slot
  or on how many slots there are).
- ``insert``: prefilled keys/values moved into freed slots, each row shifted to start at
  cache slot 0, with its own length, budget, RNG key and first-token logits. One prefill
  row may fill several slots (k samples of the same prompt share one prefill). The tokens
  of a prefix every prompt shares stay out of the slots (one copy, ``decode``'s ``prefix``).
- ``decode``: a ``lax.while_loop`` of decode steps over all slots, each row at its own
  cache index and position (``model.decode_rows``), for up to ``steps`` steps or until
  ``need`` rows have ended; a shared prefix's keys and values are read once a step for all
  the rows (``layers.prefix_attention``), not once a row. ``attention = "ragged"``: each row's
  cache is read to its own length (``kernels.ragged``), not to the cache's.
- ``put`` / ``host``: host arrays onto the mesh and back.

On a mesh each dp shard owns ``slots / dp`` slots and runs its own loop (``shard_map``
manual over dp, mp automatic: ``per_shard``), so shards never synchronise per token.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from ..model import network as model
from ..model.config import GPTJConfig
from ..session.distributed import global_array, to_host
from .static import any_shard, mask_vocab, sample_logits


class Slots(NamedTuple):
    """Per-slot decoding state (B slots). Row b's tokens sit in cache slots
    [0, length_B[b]); its next token is at that position."""

    cache: model.KVCache  # (B, H, L, K) per layer
    logits_BV: jax.Array  # fp32 logits of each row's next token
    length_B: jax.Array  # int32 tokens in the row's cache
    step_B: jax.Array  # int32 tokens generated so far (what its key is folded with)
    budget_B: jax.Array  # int32 its token budget
    active_B: jax.Array  # bool: the slot holds a row that has not ended
    key_data_BK: jax.Array  # uint32 raw PRNG key of the row


def dp_size(mesh: Mesh | None) -> int:
    return 1 if mesh is None else int(mesh.shape["dp"])


def per_shard(fn, mesh: Mesh | None, in_specs, out_specs):
    """``fn`` run by each dp shard on its own rows (manual over dp, mp automatic)."""
    if dp_size(mesh) == 1:
        return fn
    return jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs, axis_names={"dp"},
                         check_vma=False)


def empty(config: GPTJConfig, rows: int, length: int, *, mesh: Mesh | None) -> Slots:
    """Empty slots, split over the mesh's dp axis."""
    return _empty_program(mesh)(config, rows, length)


@functools.cache
def _empty_program(mesh: Mesh | None):
    out = None if mesh is None else NamedSharding(mesh, P("dp"))
    return jax.jit(_zeros, static_argnums=(0, 1, 2), out_shardings=out)


def _zeros(config: GPTJConfig, rows: int, length: int) -> Slots:
    key_shape = jax.random.key_data(jax.random.key(0)).shape
    return Slots(model.init_cache(config, rows, length), jnp.zeros((rows, config.vocab), jnp.float32),
                 jnp.zeros((rows,), jnp.int32), jnp.zeros((rows,), jnp.int32), jnp.zeros((rows,), jnp.int32),
                 jnp.zeros((rows,), bool), jnp.zeros((rows,) + key_shape, jnp.uint32))


@functools.partial(jax.jit, static_argnames="length")
def resize(slots: Slots, length: int) -> Slots:
    """The same slots with a cache of ``length`` slots (rows start at slot 0, so
    cutting keeps every row that fits)."""
    have = slots.cache.k[0].shape[2]
    fit = (lambda x: jnp.pad(x, ((0, 0), (0, 0), (0, length - have), (0, 0)))) if length > have else \
        (lambda x: x[:, :, :length])
    return slots._replace(cache=jax.tree.map(fit, slots.cache))


def _gather_rows(slots: Slots, src_N, live_N) -> Slots:
    """Slot n of the result is slot src_N[n] of ``slots``, active only where ``live_N``."""
    out = jax.tree.map(lambda x: x[src_N], slots)
    return out._replace(active_B=out.active_B & live_N)


def compact(slots: Slots, src_N, live_N, *, mesh: Mesh | None = None) -> Slots:
    """Fewer slots: slot n of the result is slot src_N[n] (global indices: a row may move to
    another dp shard; ``live_N`` False: an unused slot, inactive), split over dp again.
    Rows keep their cache, length, step, budget and key, so they decode on as before."""
    return _compact_program(mesh)(slots, src_N, live_N)


@functools.cache
def _compact_program(mesh: Mesh | None):
    out = None if mesh is None else NamedSharding(mesh, P("dp"))
    return jax.jit(_gather_rows, out_shardings=out)


def _insert_rows(slots: Slots, kv: model.KVCache, logits_PV, lens_P, src_N, slot_N, budget_N, key_data_NK, *,
                 prefix: int = 0) -> Slots:
    """Assignment n copies prefilled row src_N[n] into slot slot_N[n]; slots out of
    range (padding assignments) are dropped. A row holds ``prefix`` shared tokens,
    then its own tokens left-padded (lens_P[src] real ones): its own tokens alone go into
    the slot (the shared ones are read from their one copy, ``decode``'s ``prefix``)."""
    T, L = kv.k[0].shape[2] - prefix, slots.cache.k[0].shape[2]
    W = min(T, L)
    off_N = T - lens_P[src_N]

    def left_aligned(x_PHTK):  # (N, H, W, K): each row's real tokens moved to the front
        own = jnp.pad(x_PHTK[src_N][:, :, prefix:], ((0, 0), (0, 0), (0, T), (0, 0)))
        own = jax.vmap(lambda r, o: jax.lax.dynamic_slice_in_dim(r, o, T, axis=1))(own, off_N)
        return own[:, :, :W]

    def put(buf_BHLK, x_PHTK):
        return buf_BHLK.at[slot_N, :, :W].set(left_aligned(x_PHTK).astype(buf_BHLK.dtype), mode="drop")

    cache = model.KVCache(tuple(map(put, slots.cache.k, kv.k)), tuple(map(put, slots.cache.v, kv.v)))
    at = lambda x: x.at[slot_N]
    return Slots(cache, at(slots.logits_BV).set(logits_PV[src_N], mode="drop"),
                 at(slots.length_B).set(lens_P[src_N], mode="drop"), at(slots.step_B).set(0, mode="drop"),
                 at(slots.budget_B).set(budget_N, mode="drop"), at(slots.active_B).set(True, mode="drop"),
                 at(slots.key_data_BK).set(key_data_NK, mode="drop"))


@functools.partial(jax.jit, static_argnames=("mesh", "prefix"), donate_argnums=0)
def insert(slots: Slots, kv, logits_PV, lens_P, src_N, slot_N, budget_N, key_data_NK, *, mesh=None,
            prefix: int = 0) -> Slots:
    """``_insert_rows`` per dp shard: the prefilled rows are visible to every
    shard (they were computed split over dp), the assignments are per shard with
    slot indices local to the shard."""
    fn = per_shard(functools.partial(_insert_rows, prefix=prefix), mesh,
                    (P("dp"), P(), P(), P(), P("dp"), P("dp"), P("dp"), P("dp")), P("dp"))
    return fn(slots, kv, logits_PV, lens_P, src_N, slot_N, budget_N, key_data_NK)


def _decode_rows(params, slots: Slots, keep_B, need, max_steps, temperature, top_p, prefix, *, config: GPTJConfig,
                 steps: int, eos_id: int, valid_vocab: int | None, mesh: Mesh | None, attention: str = "dense"):
    """Up to ``max_steps`` (<= ``steps``) decode steps, stopping early once ``need``
    rows have ended or none is left (in ``sample.lockstep``: once any shard has
    ``need`` ended rows, or none has rows left). ``prefix``: the keys/values of the
    tokens every row continues (None: none; the slots hold only each row's own tokens).
    Returns (slots, tokens (B, steps): row b's new tokens are its first (step after - step
    before) columns)."""
    B = slots.length_B.shape[0]
    temperature = jnp.asarray(temperature, jnp.float32)
    top_p = jnp.asarray(top_p, jnp.float32)
    keys_B = jax.random.wrap_key_data(slots.key_data_BK)

    def body(s):
        i, n_end, sl, tok_BC = s
        tok_B = sample_logits(mask_vocab(sl.logits_BV, valid_vocab, mesh), keys_B, sl.step_B, temperature, top_p)
        tok_B = jnp.where(sl.active_B, tok_B, eos_id)
        tok_BC = jax.lax.dynamic_update_slice(tok_BC, tok_B[:, None], (0, i))
        end_B = sl.active_B & ((tok_B == eos_id) | (sl.step_B + 1 >= sl.budget_B))
        live_B = sl.active_B & ~end_B if attention == "ragged" else None  # ended rows read nothing
        logits_BV, cache = model.decode_rows(params, tok_B, sl.length_B, sl.cache, config, prefix, attention, live_B)
        grow = sl.active_B.astype(jnp.int32)
        sl = sl._replace(cache=cache, logits_BV=logits_BV, length_B=sl.length_B + grow, step_B=sl.step_B + grow,
                         active_B=sl.active_B & ~end_B)
        return i + 1, n_end + jnp.sum(end_B, dtype=jnp.int32), sl, tok_BC

    def cond(s):
        i, n_end, sl, _ = s
        return (i < max_steps) & ~any_shard(n_end >= need, mesh) & any_shard(jnp.any(sl.active_B), mesh)

    slots = slots._replace(active_B=slots.active_B & keep_B)
    start = (jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32), slots, jnp.full((B, steps), eos_id, jnp.int32))
    _, _, slots, tok_BC = jax.lax.while_loop(cond, body, start)
    return slots, tok_BC


@functools.partial(jax.jit, static_argnames=("config", "steps", "eos_id", "valid_vocab", "mesh", "attention"),
                   donate_argnums=1)
def decode(params, slots: Slots, keep_B, need, max_steps, temperature, top_p, prefix=None, *, config: GPTJConfig,
           steps: int, eos_id: int, valid_vocab: int | None, mesh: Mesh | None = None, attention: str = "dense"):
    fn = functools.partial(_decode_rows, config=config, steps=steps, eos_id=eos_id, valid_vocab=valid_vocab,
                           mesh=mesh, attention=attention)
    fn = per_shard(fn, mesh, (P(), P("dp"), P("dp"), P(), P(), P(), P(), P()), (P("dp"), P("dp")))
    return fn(params, slots, keep_B, need, max_steps, temperature, top_p, prefix)


def put(x, mesh: Mesh | None, spec: P):
    """A host array on the mesh (a global array from every process's identical copy)."""
    if mesh is None:
        return jnp.asarray(x)
    sharding = NamedSharding(mesh, spec)
    return global_array(x, sharding) if jax.process_count() > 1 else jax.device_put(x, sharding)


def host(x) -> np.ndarray:
    return to_host(x)
