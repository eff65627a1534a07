"""Continuous-batching generation: a fixed set of slots decode together, and a
slot whose row has ended (end-of-text, its token budget, or a stop string) takes
the next waiting prompt instead of idling until the whole batch has ended.

Device side (compiled, no Python per token):

- ``prefill``: a batch of waiting prompts, left-padded to a length bucket, in one
  call (``model.prefill``); prompt count and length come from small bucket sets.
  When every prompt of the call starts with the same tokens (a few-shot prompt),
  that prefix is prefilled once and each prompt computes only its own tokens on
  top of it (``model.prefill_after``; ``shared_prefix`` says how long a prefix).
- ``slots.insert``: the prefilled keys/values moved into the freed slots, each row
  shifted to start at cache slot 0 (one prefill row may fill several slots: k
  samples of the same prompt share one prefill); a shared prefix's stay out of them.
- ``slots.decode``: a ``lax.while_loop`` of decode steps over all slots, for up to
  ``chunk`` steps or until enough rows have ended; the shared prefix's keys and values
  (one copy) are read once a step for all the rows, and each slot holds its own tokens.

- ``slots.compact``: once no prompt waits, the live rows gathered into fewer slots
  (the tail of a call decodes its last rows without the ended rows' slots; dense decode
  attention only).

``slots.py`` holds the slots' state and these compiled programs; this module schedules
them (the queue, refills, stop strings).

On a mesh each dp shard owns ``slots / dp`` slots and runs its own loop
(``shard_map`` manual over dp, as ``sample.generate``), so shards never
synchronise per token. Between chunks the host reads the chunk's tokens, checks
the stop strings, frees the ended slots and refills them.

A row's tokens do not depend on its slot or its batch mates: its cache holds
only its own tokens (keys past its length are masked), its positions are those
it would have alone, and its RNG key is folded with its own token index, as in
``sample.generate``.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, PartitionSpec as P

from ..model import network as model
from ..model.config import GPTJConfig
from ..options import DecodeConfig
from ..runtime import hostcopy
from . import slots as device
from .static import keys_from_seeds, left_pad

# Cache lengths are multiples of this; each length compiles its own decode loop and insert (~2.7 s
# for the addition model on 2 cores). 64 rather than 32: the addition demo's first iteration (and
# the evaluation before it) compiled 10 decode loops instead of 15, and the sampling stages of its
# first two iterations took 103 s instead of 114 s (two interleaved runs each, empty compilation
# cache; docs/performance.md §1), with the same texts.
CACHE_GRAIN = 64
PREFIX_GRAIN = 32  # a shared prefix is cut to a multiple of this (each length compiles one prefix prefill)
PREFIX_MIN = 64  # shorter shared prefixes are prefilled with each prompt


def length_buckets(n_ctx: int, smallest: int = 16) -> list[int]:
    """Prompt lengths a prefill compiles for: 16, 24, 32, 48, 64, 96, ... (each
    at most 1.5x the previous, so a prompt pads by under half), then n_ctx."""
    out, n = [], smallest
    while n < n_ctx:
        out.append(n)
        n = n * 3 // 2 if n & (n - 1) == 0 else n * 4 // 3
    return out + [n_ctx]


def shared_prefix(prompts: Sequence[Sequence[int]], grain: int = PREFIX_GRAIN, minimum: int = PREFIX_MIN) -> int:
    """How many leading tokens every prompt shares and is prefilled once for all:
    the common prefix, leaving each prompt at least one token of its own (its
    first logits come from it), cut to a multiple of ``grain``; 0 when that is
    under ``minimum`` (or there is one prompt: nothing to share)."""
    if len(prompts) < 2:
        return 0
    first = np.asarray(prompts[0], np.int64)
    n = min(len(p) for p in prompts) - 1
    for p in prompts[1:]:
        if n < minimum:
            break
        diff = np.flatnonzero(np.asarray(p[:n], np.int64) != first[:n])
        n = int(diff[0]) if diff.size else n
    n = n // grain * grain
    return n if n >= minimum else 0


def count_bucket(n: int, multiple: int) -> int:
    """Prompts per prefill call: a power of two >= n, as a multiple of ``multiple``."""
    b = 1
    while b < n:
        b *= 2
    return -(-b // multiple) * multiple


def prefill_sizes(max_rows: int, multiple: int) -> list[int]:
    """Rows a prefill call compiles for: a quarter of ``max_rows`` (a multiple of ``multiple``),
    doubling up to ``max_rows``. A call takes the fewest that hold its prompts: its time grows
    with its rows (the addition demo's refills of ~12 prompts ran in calls of 32 rows before)."""
    sizes = [_round_up(max(max_rows // 4, 1), multiple)]
    while sizes[-1] * 2 < max_rows:
        sizes.append(sizes[-1] * 2)
    return sizes + [max_rows] if sizes[-1] < max_rows else sizes


def _round_up(n: int, grain: int) -> int:
    return -(-n // grain) * grain


def generate(params, prompts: Sequence[Sequence[int]], seeds: Sequence[int], budgets: Sequence[int], *,
             config: GPTJConfig, decode: DecodeConfig, mesh: Mesh | None = None,
             stop: Callable[[int, list[int]], bool] | None = None, progress: Callable[[int], None] | None = None,
             stats: dict | None = None) -> list[list[int]]:
    """New tokens of each request (end-of-text not included), continuously batched.

    Request i is ``prompts[i]`` (at least one token; prompt + budget within
    n_ctx) with at most ``budgets[i]`` new tokens, sampled with the key of
    ``seeds[i]`` (``decode.temperature`` 0: greedy). ``decode.slots`` rows decode together
    (rounded up to a multiple of the mesh's dp size); the decode loop runs ``decode.chunk``
    steps at most between refills, and returns earlier once ``decode.refill`` rows of a
    shard have ended while prompts are waiting (default: an eighth of a shard's
    slots). ``stop(i, tokens)``, called on the host after each chunk with the
    request's tokens so far, ends the request when True (a stop string in its
    text); its tokens then run up to the chunk's end. ``stats`` (a dict) receives
    counters: chunks, decode_steps, prefill_calls, prefill_rows, slots,
    prefix_tokens, compactions (times the live rows moved into fewer slots).

    ``decode.share_prefix``: the tokens all prompts start with (``shared_prefix``: a
    few-shot prompt) are prefilled once, not once per prompt. A row's logits then
    differ from a whole-prompt prefill's by rounding only, and the shared length
    is a function of the call's prompts: the same call gives the same tokens.

    On a mesh of several CPU devices the replicated weights are read from one host copy
    (``runtime.hostcopy.shared``): the same values, less memory traffic.
    """
    n = len(prompts)
    if not (len(seeds) == len(budgets) == n):
        raise ValueError("generate: prompts, seeds and budgets differ in length")
    for i, (p, b) in enumerate(zip(prompts, budgets)):
        if not len(p) or b < 0 or len(p) + b > config.n_ctx:
            raise ValueError(f"generate: request {i} has {len(p)} prompt tokens and a budget of {b} "
                             f"(needs >= 1 token and prompt + budget <= n_ctx={config.n_ctx})")
    results: list[list[int]] = [[] for _ in range(n)]
    pending = [i for i in range(n) if budgets[i] > 0]
    if progress is not None and len(pending) < n:
        progress(n - len(pending))
    if not pending:
        return results
    params = hostcopy.shared(params)  # one copy of the replicated weights for all CPU devices
    run = _Batcher(params, prompts, seeds, budgets, pending, config, decode, mesh)
    while run.queue or (run.slot_req >= 0).any():
        occupied = run.refill()
        tok_BC, step_B, active_B = run.decode_chunk()
        ended = run.harvest(occupied, tok_BC, step_B, active_B, results, stop)
        run.compact()
        if progress is not None and ended:
            progress(ended)
    if stats is not None:
        stats.update(run.counters)
    return results


class _Batcher:
    """One ``generate`` call's slots: which request each holds (``slot_req``, -1: free) and
    its tokens so far (``slot_step``), the queue of waiting prompt groups, the device state."""

    def __init__(self, params, prompts, seeds, budgets, pending: list[int], config: GPTJConfig,
                 decode: DecodeConfig, mesh: Mesh | None) -> None:
        self.params, self.prompts, self.budgets, self.config, self.mesh = params, prompts, budgets, config, mesh
        self.decode, self.dp = decode, device.dp_size(mesh)
        self.per = min(-(-max(decode.slots, 1) // self.dp), count_bucket(-(-len(pending) // self.dp), 1))
        self.min_per = max(1, self.per // 8)  # the fewest slots a shard is compacted to
        B = self.per * self.dp  # slots in all
        self.refill_rows = max(1, self.per // 8) if decode.refill is None else decode.refill
        # Prompts per prefill call: a quarter of max_rows, doubling up to it (three sizes: few compiles,
        # and a refill of a few rows is not padded to a call of max_rows).
        max_rows = min(count_bucket(max(2 * self.refill_rows, 4) * self.dp, self.dp), count_bucket(B, self.dp))
        self.call_rows = prefill_sizes(max_rows, self.dp)
        groups: dict[tuple, list[int]] = {}
        for i in pending:  # identical prompts (k samples of a question) share one prefill
            groups.setdefault(tuple(int(t) for t in prompts[i]), []).append(i)
        self.queue = deque(sorted(groups.values(), key=lambda g: (len(prompts[g[0]]), g[0])))  # shortest first
        self.waiting = len(pending)
        self.buckets = length_buckets(config.n_ctx)
        prefix = shared_prefix([prompts[i] for i in pending]) if decode.share_prefix else 0
        self.prefix = prefix  # the slots hold what follows it
        self.longest = _round_up(max(len(prompts[i]) - prefix + budgets[i] for i in pending), CACHE_GRAIN)
        self.key_data = np.asarray(jax.random.key_data(keys_from_seeds([seeds[i] for i in range(len(prompts))])))
        self.slot_req = np.full(B, -1)  # request in each slot
        self.slot_step = np.zeros(B, np.int64)  # its tokens so far
        self.state: device.Slots | None
        self.L, self.state = 0, None
        self.shared = _prefix_cache(params, prompts[pending[0]][:prefix], config, mesh) if prefix else None
        self.counters = {"chunks": 0, "decode_steps": 0, "prefill_calls": 0, "prefill_rows": 0, "slots": B,
                         "prefix_tokens": prefix, "compactions": 0}
        self.sharded = None if self.dp == 1 else mesh
        self.step = functools.partial(device.decode, config=config, steps=decode.chunk, eos_id=decode.eos_id,
                                      valid_vocab=decode.valid_vocab, mesh=self.sharded, attention=decode.attention)

    def _admit(self) -> list:
        """Free slots (the emptiest shard first) given to waiting prompts: (prompt, [(request,
        slot), ...]), one prefill row each."""
        free = [[b for b in range(s * self.per, (s + 1) * self.per) if self.slot_req[b] < 0] for s in range(self.dp)]
        order = []
        for _ in range(min(sum(map(len, free)), self.waiting)):
            s = max(range(self.dp), key=lambda s: len(free[s]))  # noqa: B023 -- used at once
            order.append(free[s].pop(0))
        self.waiting -= len(order)
        admitted = []
        while self.queue and order:
            g = self.queue.popleft()
            if len(g) > len(order):
                self.queue.appendleft(g[len(order):])
                g = g[:len(order)]
            admitted.append((self.prompts[g[0]], [(i, order.pop(0)) for i in g]))
            for i, b in admitted[-1][1]:
                self.slot_req[b], self.slot_step[b] = i, 0
        return admitted

    def refill(self) -> np.ndarray:
        """Fill the free slots from the queue, the cache sized for this chunk (rows start at
        slot 0). Returns the occupied slots."""
        admitted = self._admit()
        occupied = np.flatnonzero(self.slot_req >= 0)
        need_len = max(len(self.prompts[self.slot_req[b]]) - self.prefix
                       + min(self.budgets[self.slot_req[b]], int(self.slot_step[b]) + self.decode.chunk)
                       for b in occupied)
        target = min(_round_up(need_len, CACHE_GRAIN), self.longest)
        if self.state is None:
            self.L = target
            self.state = device.empty(self.config, len(self.slot_req), self.L, mesh=self.sharded)
        elif target > self.L or target <= self.L * 3 // 4:
            self.L = target
            self.state = device.resize(self.state, self.L)
        while admitted:  # prefill calls of the fewest rows that hold the admitted prompts (at most max_rows)
            rows = next((r for r in self.call_rows if r >= len(admitted)), self.call_rows[-1])
            self.state = _prefill_into(self.params, self.state, admitted[:rows], rows, self.budgets, self.key_data,
                                       config=self.config, buckets=self.buckets, pad_id=self.decode.pad_id,
                                       per=self.per, mesh=self.mesh, counters=self.counters, shared=self.shared)
            del admitted[:rows]
        return occupied

    def decode_chunk(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Decode until enough rows end (while prompts wait) or ``chunk`` steps: the chunk's
        tokens, each slot's step count and whether its row goes on, on the host."""
        keep = device.put(self.slot_req >= 0, self.mesh, P("dp"))
        need = self.refill_rows if self.queue else self.per + 1
        self.state, tok_BC = self.step(self.params, self.state, keep, need, self.decode.chunk,
                                       float(self.decode.temperature), float(self.decode.top_p), self.shared)
        tok_BC, step_B, active_B = (device.host(x) for x in (tok_BC, self.state.step_B, self.state.active_B))
        self.counters["chunks"] += 1
        self.counters["decode_steps"] += int(
            (step_B - np.where(self.slot_req >= 0, self.slot_step, step_B)).max(initial=0))
        return tok_BC, step_B, active_B

    def compact(self) -> None:
        """Once no prompt waits, the live rows into fewer slots, spread evenly over the dp
        shards: per shard, the power of two that holds its share (at least an eighth of the
        first count), when that drops a quarter of the slots at least. The tail of a call then
        decodes its last long rows without the ended rows' slots (a row's tokens do not depend
        on its slot, its shard or the slot count). Not under ``decode.attention = "ragged"``: an
        ended row's slot reads no cache there, and moving the caches cost more than the ended
        rows' share of the other layers saves (docs/performance.md §3.8)."""
        if self.decode.attention == "ragged":
            return
        live = np.flatnonzero(self.slot_req >= 0)
        share = -(-len(live) // self.dp)
        per = max(count_bucket(share, 1), self.min_per)
        if self.queue or self.state is None or not len(live) or per > self.per * 3 // 4:
            return
        src_DN = np.zeros((self.dp, per), np.int32)
        ok_DN = np.zeros((self.dp, per), bool)
        for s in range(self.dp):
            rows = live[s * share:(s + 1) * share]
            src_DN[s, :len(rows)], ok_DN[s, :len(rows)] = rows, True
        src, ok = src_DN.ravel(), ok_DN.ravel()
        self.state = device.compact(self.state, device.put(src, self.mesh, P()), device.put(ok, self.mesh, P()),
                                    mesh=self.sharded)
        self.per, self.slot_req, self.slot_step = per, np.where(ok, self.slot_req[src], -1), self.slot_step[src]
        self.counters["compactions"] += 1

    def harvest(self, occupied: np.ndarray, tok_BC: np.ndarray, step_B: np.ndarray, active_B: np.ndarray,
                results: list[list[int]], stop: Callable[[int, list[int]], bool] | None) -> int:
        """The chunk's tokens into ``results``; rows that ended free their slots. Returns how many ended."""
        ended, eos_id = 0, self.decode.eos_id
        for b in occupied:
            i, new = self.slot_req[b], int(step_B[b] - self.slot_step[b])
            results[i].extend(int(t) for t in tok_BC[b, :new])
            self.slot_step[b] = step_B[b]
            if not active_B[b] or (stop is not None and new and stop(i, results[i])):
                if results[i] and results[i][-1] == eos_id:
                    results[i].pop()
                self.slot_req[b] = -1
                ended += 1
        return ended


def _prefix_cache(params, tokens: Sequence[int], config: GPTJConfig, mesh: Mesh | None) -> model.KVCache:
    """The keys/values of a shared prefix, (1, H, P, K) per layer (every dp shard
    holds a copy)."""
    tokens_1T = np.asarray([tokens], np.int32)
    _, kv, _ = model.prefill(params, device.put(tokens_1T, mesh, P()),
                             device.put(np.ones_like(tokens_1T, bool), mesh, P()), config, len(tokens))
    return kv


def _prefill_into(params, state: device.Slots, admitted, rows: int, budgets, key_data, *, config, buckets, pad_id,
                  per: int, mesh, counters: dict, shared: model.KVCache | None = None) -> device.Slots:
    """Prefill the ``admitted`` prompts in one batched call of ``rows`` rows and
    copy each into its slots (``admitted``: (prompt, [(request, slot), ...])).
    With a ``shared`` prefix cache, only each prompt's tokens after it are run."""
    dp = device.dp_size(mesh)
    prefix = 0 if shared is None else shared.k[0].shape[2]
    own = [p[prefix:] for p, _ in admitted]
    T = next(b for b in buckets if b >= max(map(len, own)))
    tokens_PT, mask_PT = left_pad(own, pad_id, length=T, rows=rows)
    lens_P = mask_PT.sum(axis=1).astype(np.int32)
    tokens_PT, mask_PT = device.put(tokens_PT, mesh, P("dp")), device.put(mask_PT, mesh, P("dp"))
    if shared is None:
        logits_PV, kv, _ = model.prefill(params, tokens_PT, mask_PT, config, T)
    else:
        logits_PV, kv = model.prefill_after(params, shared, tokens_PT, mask_PT, config)
    counters["prefill_calls"] += 1
    counters["prefill_rows"] += rows
    # Per shard: the assignments to its slots, padded with dropped ones (slot index = per) to
    # one per slot, so that the copy compiles once per prefill shape.
    mine = [[(i, r, b - s * per) for r, (_, slots) in enumerate(admitted) for i, b in slots if b // per == s]
            for s in range(dp)]
    N = per
    src = np.zeros((dp, N), np.int32)
    slot = np.full((dp, N), per, np.int32)
    budget = np.zeros((dp, N), np.int32)
    keys = np.zeros((dp, N) + key_data.shape[1:], key_data.dtype)
    for s, assigned in enumerate(mine):
        for j, (i, r, local) in enumerate(assigned):
            src[s, j], slot[s, j], budget[s, j], keys[s, j] = r, local, budgets[i], key_data[i]
    flat = lambda x: device.put(x.reshape((dp * N,) + x.shape[2:]), mesh, P("dp"))
    rep = lambda x: device.put(x, mesh, P())
    return device.insert(state, kv, logits_PV, rep(lens_P), flat(src), flat(slot), flat(budget), flat(keys),
                   mesh=None if dp == 1 else mesh, prefix=prefix)
