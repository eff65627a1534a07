"""Fine-tuning: AdamW with warmup + anneal, masked cross-entropy, gradient
accumulation inside one jit'd step, master weights kept apart from the compute dtype.

A batch is the five (A, R, T) arrays of ``packing.py``: A accumulation
micro-batches of R rows of T tokens, with next-token ``targets``, loss ``weights``,
``segments`` (packed examples attend only to themselves) and ``positions``. How
examples become rows (padded, packed segments, the original's stream) and which
tokens carry loss are ``packing.py``'s.

Master weights: ``TrainState.params`` holds the weights the optimizer updates, in
``master_dtype`` (float32 by default). Each step casts them to the model's compute
dtype (``config.dtype``) for the forward and backward passes, so under bf16 compute
an update of 1e-6 still moves a weight of 0.02 (a bf16 weight has a spacing of
~1.2e-4 there and would round it away). ``master_dtype = "bfloat16"`` with bf16
compute stores and rounds the weights in bf16 (half the memory, small updates lost).
"""

from __future__ import annotations

import itertools
from typing import Any, NamedTuple
from collections.abc import Callable, Iterable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax


from ..model import lora
from ..model import network as model
from . import packing
from .loss import logits_logp, token_logp, token_loss  # noqa: F401  (the backend's API)
from ..runtime import sharding
from ..session.distributed import global_array, place, to_host
from ..options import OPT_STATE_DTYPES, TrainConfig, check_dtypes
from ..model.config import ModelConfig
from .step_lr import StepLr
from .packing import Encoded, bucket_lengths, encode_example, plan_steps  # noqa: F401  (the backend's API)


class TrainState(NamedTuple):
    params: Any  # the master weights (master_dtype), cast to the compute dtype inside each step
    opt_state: Any
    step: jax.Array  # int32 scalar: optimizer steps taken


# ----------------------------------------------------------------------------- optimizer


def master_params(params: Any, master_dtype: str) -> Any:
    """A fresh copy of ``params`` in the master dtype (the update donates its state,
    so the caller's arrays must not be used as the state)."""
    dt = jnp.dtype(master_dtype)
    return jax.tree.map(lambda p: jnp.copy(p) if p.dtype == dt else p.astype(dt), params)


def init_state(params: Any, tx: optax.GradientTransformation) -> TrainState:
    # Moments in fp32 even for bf16 params: bf16 second moments underflow.
    return TrainState(params, tx.init(jax.tree.map(lambda p: p.astype(jnp.float32), params)),
                      jnp.zeros((), jnp.int32))


def with_state_dtype(tx: optax.GradientTransformation, dtype: str) -> optax.GradientTransformation:
    """``tx`` whose floating state is stored in ``dtype`` and computed in fp32 (the
    update itself is always fp32).

    - ``"float32"``: as optax keeps it (8 bytes a parameter for Adam's two moments).
    - ``"bfloat16"``: both moments in bf16 (4 bytes a parameter). Rounded to nearest
      after every step, Adam's second moment stops decaying: its per-step change,
      (1 - b2) = 0.1 % at b2 = 0.999, is under half a bf16 spacing (0.2-0.4 %), so
      over a long stage the update drifts from fp32's (docs/fidelity.md).
    - ``"mixed"``: the first moment in bf16, the second in fp32 (6 bytes a parameter).
      The first moment moves by (1 - b1) = 10 % a step, far above bf16's rounding, so
      the update follows fp32 moments' over any stage length
      (``tests/test_optimizer_moments.py``); the paper files' setting.
    """
    if dtype == "float32":
        return tx
    if dtype not in OPT_STATE_DTYPES:
        raise ValueError(f"opt_state_dtype must be one of {OPT_STATE_DTYPES}, got {dtype!r}")

    def cast(tree, to):
        return jax.tree.map(lambda x: x.astype(to) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)

    def store(state):
        if dtype == "bfloat16":
            return cast(state, jnp.bfloat16)

        def one(node):  # mixed: Adam's nu stays fp32, everything else floating is bf16
            if isinstance(node, optax.ScaleByAdamState):
                return node._replace(mu=cast(node.mu, jnp.bfloat16), nu=cast(node.nu, jnp.float32))
            return cast(node, jnp.bfloat16)

        return jax.tree.map(one, state, is_leaf=lambda n: isinstance(n, optax.ScaleByAdamState))

    def update(updates, state, params=None):
        new_updates, new_state = tx.update(updates, cast(state, jnp.float32), params)
        return new_updates, store(new_state)

    return optax.GradientTransformation(lambda params: store(tx.init(params)), update)


def state_shardings(state: Any, mesh, zero: int, compute_dtype: Any) -> Any:
    """Shardings of a (possibly abstract) ``TrainState``: the rule table, the
    optimizer state also over dp with ``zero = 1`` (``sharding.train_state_shardings``).
    Master weights kept in another dtype than the compute one (fp32 under bf16) are
    optimizer state as well: with ZeRO-1 they are split over dp like the moments, and
    each step all-gathers their compute-dtype cast (``make_update``)."""
    state_sh = sharding.train_state_shardings(state, mesh, zero)
    if zero and any(x.dtype != compute_dtype for x in jax.tree.leaves(state.params)):
        specs = sharding.zero_tree_specs(state.params, mesh)
        state_sh = state_sh._replace(params=jax.tree.map(
            lambda spec: jax.sharding.NamedSharding(mesh, spec), specs,
            is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec)))
    return state_sh


def build_state(params: Any, tx: optax.GradientTransformation, state_sh: Any) -> TrainState:
    """``init_state`` jit'd straight into ``state_sh`` (``state_shardings``): the optimizer state
    is born in its final (ZeRO) shardings, so no replicated copy of the moments ever exists
    (``params`` donated: pass a copy to keep yours)."""
    return jax.jit(lambda p: init_state(p, tx), out_shardings=state_sh, donate_argnums=0)(params)


# ----------------------------------------------------------------------------- step


def make_update(config: ModelConfig, tx: optax.GradientTransformation, mesh=None,
                state_example: TrainState | None = None, state_shardings: Any = None, *,
                accum_dtype: str = "float32", remat: bool = False,
                adapter: lora.LoraSpec | None = None, objective: Callable = token_loss,
                loss_chunk: int | None = None, loss_tokens: int | None = None, loss_dot_dtype: str | None = None,
                step_lr: StepLr | None = None) -> Callable:
    """``update(state, batch) -> (state, metrics)``, jit'd with the state donated.
    ``step_lr`` (the ``StepLr`` ``tx`` was built with): ``update(state, batch, lr)`` takes the
    step's learning rate as an argument, so the program is the same for any length (``step_lr.py``).

    ``objective(params, micro_batch, config, remat, adapters, adapter, loss_chunk=, loss_tokens=,
    loss_dot_dtype=) -> (loss sum, count)``: what the step minimises, ``loss sum / count`` over its micro-batches
    (``token_loss``; ``preference.dpo_objective`` counts pairs instead of tokens).
    ``loss_chunk``, ``loss_tokens``, ``loss_dot_dtype``: which output layer, on which operands
    (``loss.py``; all None: the plain path).

    ``adapter`` (LoRA): the state's params are the fp32 adapters (the only thing
    trained, with their own Adam state) and ``update(state, batch, base)`` takes the
    frozen base in the compute dtype, laid out by the rule table, never donated.

    The master weights are cast to the compute dtype (``config.dtype``) once per
    step (on a mesh: laid out by the rule table, which all-gathers master weights
    that ZeRO-1 split over dp). Gradients of the summed loss are accumulated in
    ``accum_dtype`` over the A micro-batches with a scan and divided by the total
    loss-token count, so the step minimises the per-token mean over every loss token
    of the step (not a mean of means). The optimizer and the update run in fp32 on
    the master weights. ``remat``: per-layer rematerialisation (``token_loss``).
    With a mesh, ``state_example`` fixes the state's shardings (rule table) and the
    batch is split over "dp" on its R axis.
    """
    compute = model.dtype_of(config)
    accum = jnp.dtype(accum_dtype)
    head = {"loss_chunk": loss_chunk, "loss_tokens": loss_tokens, "loss_dot_dtype": loss_dot_dtype}
    if adapter is None:
        grad_fn = jax.value_and_grad(lambda p, mb, base: objective(p, mb, config, remat, **head), has_aux=True)
    else:
        grad_fn = jax.value_and_grad(lambda ad, mb, base: objective(base, mb, config, remat, ad, adapter, **head),
                                     has_aux=True)

    def update(state: TrainState, batch: Mapping[str, jax.Array], *args: Any, base: Any = None):
        if step_lr is not None:  # the traced lr argument, read by tx's schedule below
            (step_lr.current,), args = args[:1], args[1:]
        if args:
            base, = args
        if adapter is None:
            params_c = jax.tree.map(lambda p: p.astype(compute), state.params)
        else:
            params_c = state.params  # the adapters: trained and applied in fp32
        if mesh is not None:
            params_c = jax.lax.with_sharding_constraint(params_c, sharding.tree_shardings(params_c, mesh))

        def micro(carry, mb):
            g_acc, loss_acc, n_acc = carry
            (loss_sum, n), g = grad_fn(params_c, mb, base)
            g_acc = jax.tree.map(lambda a, b: a + b.astype(accum), g_acc, g)
            return (g_acc, loss_acc + loss_sum, n_acc + n), None

        zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, accum), params_c)
        scalar = jnp.zeros((), jnp.float32)
        (g_sum, loss_sum, n), _ = jax.lax.scan(micro, (zeros, scalar, scalar), batch)
        denom = jnp.maximum(n, 1.0)
        grads = jax.tree.map(lambda g: g.astype(jnp.float32) / denom, g_sum)
        updates, opt_state = tx.update(grads, state.opt_state,
                                       jax.tree.map(lambda p: p.astype(jnp.float32), state.params))
        params = jax.tree.map(lambda p, u: (p.astype(jnp.float32) + u).astype(p.dtype), state.params, updates)
        metrics = {"loss": loss_sum / denom, "tokens": n, "grad_norm": optax.tree.norm(grads)}
        if step_lr is not None:
            step_lr.current = None
        return TrainState(params, opt_state, state.step + 1), metrics

    if mesh is None:
        return jax.jit(update, donate_argnums=0)
    if state_example is None and state_shardings is None:
        raise ValueError("make_update: a mesh needs state_example to derive the state shardings")
    # state_shardings (optional): the state's shardings as given, e.g. ZeRO-1's (distributed.py)
    state_sh = sharding.tree_shardings(state_example, mesh) if state_shardings is None else state_shardings
    batch_sh = sharding.batch_sharding(mesh, batch_axis=1, ndim=3)
    out_sh = (state_sh, sharding.replicated(mesh))
    if adapter is None:
        lr_sh = () if step_lr is None else (sharding.replicated(mesh),)
        return jax.jit(update, in_shardings=(state_sh, batch_sh, *lr_sh), out_shardings=out_sh, donate_argnums=0)
    # The base's layout is its own arrays' (the rule table's, as loaded).
    return jax.jit(update, out_shardings=out_sh, donate_argnums=0)


# ----------------------------------------------------------------------------- loop


def dims(config: ModelConfig) -> tuple[int, int, int, int]:
    """(n_layer, d_model, d_ff, vocab): what packing's cost model needs."""
    return config.n_layer, config.d_model, config.d_ff, config.vocab


def train(params: Any, config: ModelConfig, encoded: Sequence[Encoded], job: TrainConfig, *, mesh=None,
          progress: Callable[[int], None] | None = None, snapshots: Any = None, adapters: Any = None,
          batches: Iterable[dict] | None = None, objective: Callable = token_loss) -> tuple[Any, list[float], int]:
    """Run ``job.steps`` optimizer steps from ``params`` (left intact). Returns (master
    params in ``job.master_dtype``, per-step losses, number of loss tokens). Each step
    takes batch_size x grad_accum examples (``packing = "stream"``: chunks).

    With a ``mesh`` the state is laid out by the rule table and built directly in
    its shardings (never replicated first); ``zero = 1`` also splits the optimizer
    state over "dp" (ZeRO-1: ``state_shardings``), so fp32 masters come back split
    over dp. Batches become global arrays from each process's addressable slices,
    so the same call runs on several processes. ``opt_state_dtype``: the moments'
    storage dtype (``with_state_dtype``). ``snapshots`` (``resume.Snapshots``):
    continue from the stage's saved state if there is one, and save it as it goes.

    ``job.adapter`` (``lora.LoraSpec``): ``params`` is the frozen base, kept in its own
    dtype (cast to the compute dtype only where that differs), and the LoRA adapters
    are trained instead, starting from ``adapters`` (default: fresh ones drawn from
    the seed, the identity); returns the trained adapters in place of the params.

    ``batches`` / ``objective``: another job's host batches (A, R, T) and what its steps
    minimise (``make_update``), in place of ``encoded``'s ``packing`` batches and the token loss
    (``preference.py``'s DPO)."""
    check_dtypes(config, job.master_dtype, job.accum_dtype)
    if job.zero and mesh is None:
        raise ValueError("zero = 1 splits the optimizer state over a mesh's dp axis: it needs a mesh")
    adapter, master_dtype = job.adapter, job.master_dtype
    if job.steps == 0:  # nothing trained: the params, or the adapters as they start
        return (params if adapter is None else
                adapters if adapters is not None else fresh_adapters(config, adapter, job.seed)), [], 0
    rows = 1 if mesh is None else sharding.dp_size(mesh)
    if batches is None:
        batches = packing_batches(encoded, steps=job.steps, batch_size=job.batch_size, grad_accum=job.grad_accum,
                                  seed=job.seed, seq_len=job.seq_len, pad_id=job.pad_id, dp=rows,
                                  packing=job.packing, loss=job.loss, config=config)
    step_lr = StepLr(job.optimizer.schedule_fn(job.steps), None if mesh is None else sharding.replicated(mesh))
    tx = with_state_dtype(job.optimizer.build(job.steps, learning_rate=step_lr), job.opt_state_dtype)
    compute = model.dtype_of(config)
    base = None
    if adapter is not None:
        base, params = _frozen_base(params, compute, mesh), adapters
        if params is None:
            params = fresh_adapters(config, adapter, job.seed)
        master_dtype = "float32"  # adapters are fp32 whatever the model's dtypes
    state, state_sh, restored = _first_state(params, tx, master_dtype, mesh, job.zero, compute, snapshots)
    del params  # the state holds the (master) copy
    put = (lambda batch: batch) if mesh is None else _put_batch(sharding.batch_sharding(mesh, batch_axis=1, ndim=3))
    update = make_update(config, tx, mesh, state_shardings=state_sh, accum_dtype=job.accum_dtype, remat=job.remat,
                         adapter=adapter, objective=objective, loss_chunk=job.loss_chunk,
                         loss_tokens=job.loss_tokens, loss_dot_dtype=job.loss_dot_dtype, step_lr=step_lr)
    update = step_lr.feeding(update, base)
    state, metrics, n_tokens = run_steps(update, state, batches, mesh=mesh, put=put, progress=progress,
                                         snapshots=snapshots, restored=restored)
    losses = [float(to_host(x)) for x in metrics]
    return state.params, losses, n_tokens


def _first_state(params: Any, tx: optax.GradientTransformation, master_dtype: str, mesh, zero: int, compute: Any,
                 snapshots: Any) -> tuple[TrainState, Any, Any]:
    """The state training starts from (a snapshot's, ``resume.py``, laid out as a fresh one
    would be; else a fresh one over a master-dtype copy of ``params``), its shardings (None
    without a mesh) and the restored snapshot (None)."""
    if mesh is None:
        # A copy in the master dtype: the update donates its state; the caller's arrays must survive.
        params, state_sh = master_params(params, master_dtype), None
    else:
        params = jax.jit(lambda p: master_params(p, master_dtype),
                         out_shardings=sharding.tree_shardings(params, mesh))(place(params, mesh))
    # The state's shapes, for its shardings and a snapshot's restore (traced once).
    abstract = None if mesh is None and snapshots is None else jax.eval_shape(lambda p: init_state(p, tx), params)
    if mesh is not None:
        state_sh = state_shardings(abstract, mesh, zero, compute)
    restored = snapshots.restore(abstract, state_sh) if snapshots is not None else None
    if restored:
        return restored.state, state_sh, restored
    if mesh is None:
        return init_state(params, tx), state_sh, None
    return build_state(params, tx, state_sh), state_sh, None  # the moments born in their (ZeRO) shardings


def _put_batch(batch_sh: Any) -> Callable[[Mapping], dict]:
    """A host batch as global arrays with ``batch_sh`` (each process places its own slices)."""
    return lambda batch: {k: global_array(v, batch_sh) for k, v in batch.items()}


def fresh_adapters(config: ModelConfig, adapter: lora.LoraSpec, seed: int) -> Any:
    """A stage's new LoRA adapters (the identity), drawn from its seed."""
    return lora.init_adapters(config, adapter, jax.random.fold_in(jax.random.key(seed), 0x10CA))


def _frozen_base(params: Any, compute: Any, mesh) -> Any:
    """The frozen base of a LoRA stage in the compute dtype (no copy when it is stored so),
    laid out by the rule table on a mesh."""
    if mesh is not None:
        params = place(params, mesh)
    if all(x.dtype == compute for x in jax.tree.leaves(params)):
        return params
    out_sh = None if mesh is None else sharding.tree_shardings(params, mesh)
    return jax.jit(lambda p: jax.tree.map(lambda x: x.astype(compute), p), out_shardings=out_sh)(params)


def packing_batches(encoded: Sequence[Encoded], *, config: ModelConfig, **kw) -> Iterable[dict[str, np.ndarray]]:
    """``packing.step_batches`` with the model's dimensions for the row-shape choice."""
    return packing.step_batches(encoded, dims=dims(config), **kw)


def run_steps(update: Callable, state: TrainState, batches: Iterable[Mapping[str, np.ndarray]], *, mesh=None,
              put: Callable[[Mapping], Any] = lambda batch: batch,
              progress: Callable[[int], None] | None = None, snapshots: Any = None,
              restored: Any = None) -> tuple[TrainState, list, int]:
    """The step loop of ``train``: one update per host batch.

    ``put`` places a host batch on the devices (multi-process runs build global
    arrays). ``restored`` (``resume.Restored``): the state is a snapshot's, whose
    steps are skipped in ``batches`` (the batch plan is a function of the seed);
    ``snapshots.step_done`` runs after every step. Returns (state, per-step loss
    arrays, number of loss tokens)."""
    metrics, n_tokens, start = [], 0, 0
    if restored:
        metrics, n_tokens, start = list(restored.losses), restored.tokens, restored.step
        batches = itertools.islice(batches, start, None)
        if progress is not None:
            progress(start)
    serial = sharding.needs_serial_steps(mesh)
    for step, batch in enumerate(batches, start + 1):
        n_tokens += int(batch["weights"].sum())
        state, m = update(state, put(batch))
        if serial:  # overlapping steps' all-reduces deadlock XLA:CPU's in-process rendezvous
            jax.block_until_ready(m["loss"])
        metrics.append(m["loss"])
        if snapshots is not None:
            snapshots.step_done(state, step, metrics, n_tokens)
        if progress is not None:
            progress(1)
    return state, metrics, n_tokens
