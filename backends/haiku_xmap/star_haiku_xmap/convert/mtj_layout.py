"""mesh-transformer-jax slim checkpoints: their layout, and how it maps onto this
backend's parameters (``mtj_import.py`` reads the files, ``mtj_export.py`` writes them).

A slim checkpoint (what mesh-transformer-jax's ``slim_model.py`` writes and its
``read_ckpt`` reads) is a folder ``shard_0 … shard_{n-1}``, one per model-parallel
shard, each holding ``0.npz … 15.npz``. Flattening the ``{"params", "step"}``
pytree in sorted-key order gives a list of leaves; every shard stores its own
slice of each leaf, and that list is cut into 16 contiguous pieces, one per
file, as ``arr_0.npy, arr_1.npy, …``. bf16 arrays carry numpy dtype ``V2``.

Leaf names (haiku module paths under ``causal_transformer_shard/~/``; modules are
numbered in the order mesh-transformer-jax builds them, so a layer's q, v, k are
``linear``, ``linear_1``, ``linear_2``), per-shard shapes for n shards, and how
the shards combine into this backend's parameters::

    embedding_shard/~/linear        b (D,) summed, folded into wte    w (V/n, D) -> wte rows
    layer_i/~/linear                w (D, D/n) -> h_i/attn/q/w, concatenated on the output dim
    layer_i/~/linear_1              w (D, D/n) -> h_i/attn/v/w
    layer_i/~/linear_2              w (D, D/n) -> h_i/attn/k/w
    layer_i/~/linear_3              w (D/n, D) -> h_i/attn/out/w, concatenated on the input dim
    layer_i/~/linear_4              b (4D/n,), w (D, 4D/n) -> h_i/mlp/fc_in/{b, w}
    layer_i/~/linear_5              b (D,) summed, w (4D/n, D) -> h_i/mlp/fc_out/{b, w}
    layer_i/~/replicated_layer_norm offset, scale (D,): shard 0 -> h_i/ln
    projection_shard/~/linear       b (V/n,), w (D, V/n) -> lm_head/{b, w}
    projection_shard/~/replicated_layer_norm  offset, scale (D,): shard 0 -> ln_f
    step                            () an integer, recorded in the checkpoint's extra

Both frameworks store weights as (in, out), so nothing is transposed. The
embedding bias exists because mesh-transformer-jax embeds with a one-hot matmul
that has a bias; every token gets the sum of the shards' biases added, which is
what folding it into every row of ``wte`` reproduces (as Hugging Face's
conversion does). fc_out's bias is added by every shard before the cross-shard
sum, hence summed too.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import numpy as np

from star_engine import UserError

from ..model.config import PRESETS, GPTJConfig
from ..checkpoint.safeio import read_json

PREFIX = "causal_transformer_shard/~/"
PIECES = 16  # files per shard mesh-transformer-jax writes

# The 10 leaves of one layer: (mtj module, name) -> (native module, name, how)
# how: ("cat", axis) concatenate shards on axis; ("sum",) add the shards; ("first",) shard 0.
_LAYER = {
    ("linear", "w"): ("attn/q", "w", ("cat", 1)),
    ("linear_1", "w"): ("attn/v", "w", ("cat", 1)),
    ("linear_2", "w"): ("attn/k", "w", ("cat", 1)),
    ("linear_3", "w"): ("attn/out", "w", ("cat", 0)),
    ("linear_4", "b"): ("mlp/fc_in", "b", ("cat", 0)),
    ("linear_4", "w"): ("mlp/fc_in", "w", ("cat", 1)),
    ("linear_5", "b"): ("mlp/fc_out", "b", ("sum",)),
    ("linear_5", "w"): ("mlp/fc_out", "w", ("cat", 0)),
    ("replicated_layer_norm", "offset"): ("ln", "offset", ("first",)),
    ("replicated_layer_norm", "scale"): ("ln", "scale", ("first",)),
}
_TOP = {
    ("embedding_shard/~/linear", "b"): ("wte", "bias", ("sum",)),  # folded into wte/embeddings
    ("embedding_shard/~/linear", "w"): ("wte", "embeddings", ("cat", 0)),
    ("projection_shard/~/linear", "b"): ("lm_head", "b", ("cat", 0)),
    ("projection_shard/~/linear", "w"): ("lm_head", "w", ("cat", 1)),
    ("projection_shard/~/replicated_layer_norm", "offset"): ("ln_f", "offset", ("first",)),
    ("projection_shard/~/replicated_layer_norm", "scale"): ("ln_f", "scale", ("first",)),
}


@dataclass(frozen=True)
class MtjLeaf:
    name: str  # "params/causal_transformer_shard/~/layer_0/~/linear/w" or "step"
    native: tuple[str, ...] | None  # (module, name) of this backend's parameter; None for step
    how: tuple
    full_shape: tuple[int, ...]  # the combined (native) shape
    shard_shape: tuple[int, ...]  # what each shard stores


def check_config(config: GPTJConfig, shards: int) -> None:
    """Refuse configs a mesh-transformer-jax GPT-J cannot have (UserError)."""
    c = config
    if c.n_head * c.d_head != c.d_model:
        raise UserError(f"mtj: n_head x d_head = {c.n_head * c.d_head} must equal d_model {c.d_model}")
    if c.d_ff != 4 * c.d_model:
        raise UserError(f"mtj: d_ff {c.d_ff} must be 4 x d_model = {4 * c.d_model}")
    for what, value in (("vocab", c.vocab), ("n_head", c.n_head), ("d_model", c.d_model)):
        if value % shards:
            raise UserError(f"mtj: {what} {value} is not divisible by {shards} shards")


def leaf_layout(config: GPTJConfig, shards: int) -> list[MtjLeaf]:
    """Every leaf of a slim checkpoint in file order (sorted keys), with shapes."""
    check_config(config, shards)
    c, n = config, shards
    D, F, V = c.d_model, c.d_ff, c.vocab
    shard_shapes = {
        ("linear", "w"): (D, D // n), ("linear_1", "w"): (D, D // n), ("linear_2", "w"): (D, D // n),
        ("linear_3", "w"): (D // n, D), ("linear_4", "b"): (F // n,), ("linear_4", "w"): (D, F // n),
        ("linear_5", "b"): (D,), ("linear_5", "w"): (F // n, D),
        ("replicated_layer_norm", "offset"): (D,), ("replicated_layer_norm", "scale"): (D,),
        ("embedding_shard/~/linear", "b"): (D,), ("embedding_shard/~/linear", "w"): (V // n, D),
        ("projection_shard/~/linear", "b"): (V // n,), ("projection_shard/~/linear", "w"): (D, V // n),
        ("projection_shard/~/replicated_layer_norm", "offset"): (D,),
        ("projection_shard/~/replicated_layer_norm", "scale"): (D,),
    }

    def full(shape: tuple[int, ...], how: tuple) -> tuple[int, ...]:
        if how[0] != "cat":
            return shape
        out = list(shape)
        out[how[1]] *= n
        return tuple(out)

    entries: list[tuple[str, str, MtjLeaf]] = []
    for (module, name), (nat_mod, nat_name, how) in _TOP.items():
        shp = shard_shapes[(module, name)]
        entries.append((PREFIX + module, name, MtjLeaf(f"params/{PREFIX}{module}/{name}", (nat_mod, nat_name), how,
                                                       full(shp, how), shp)))
    for i in range(c.n_layer):
        for (module, name), (nat_mod, nat_name, how) in _LAYER.items():
            shp = shard_shapes[(module, name)]
            mod = f"{PREFIX}layer_{i}/~/{module}"
            entries.append((mod, name, MtjLeaf(f"params/{mod}/{name}", (f"h_{i}/{nat_mod}", nat_name), how,
                                               full(shp, how), shp)))
    entries.sort(key=lambda e: (e[0], e[1]))  # jax flattens dicts in sorted-key order, level by level
    return [e[2] for e in entries] + [MtjLeaf("step", None, ("step",), (), ())]


def piece_sizes(n_leaves: int, pieces: int = PIECES) -> list[int]:
    """How many leaves each of the ``pieces`` files holds (contiguous, balanced)."""
    k, m = divmod(n_leaves, pieces)
    return [k + (1 if i < m else 0) for i in range(pieces)]


def config_from_file(path: str | os.PathLike, *, dtype: str = "bfloat16") -> GPTJConfig:
    """A GPTJConfig from a JSON file: mesh-transformer-jax's own config (``layers``,
    ``d_model``, ``n_heads``, ``n_vocab``, ``pe_rotary_dims``, ``seq``) or this
    backend's field names."""
    p = Path(path)
    d = read_json(p, 1 << 20, error=UserError)
    if not isinstance(d, dict):
        raise UserError(f"{p}: not a JSON object")
    try:
        if "layers" in d:
            if d.get("pe", "rotary") != "rotary" or d.get("norm", "layernorm") != "layernorm":
                raise UserError(f"{p}: only pe = 'rotary' and norm = 'layernorm' (GPT-J) can be imported")
            D, H = d["d_model"], d["n_heads"]
            if type(D) is not int or type(H) is not int or H <= 0:
                raise UserError(f"{p}: d_model and n_heads must be positive integers, got {D!r} and {H!r}")
            return GPTJConfig(n_layer=d["layers"], d_model=D, n_head=H, d_head=D // H, d_ff=4 * D,
                              rotary_dim=d["pe_rotary_dims"], n_ctx=d["seq"], vocab=d["n_vocab"], dtype=dtype)
        return GPTJConfig.from_dict({**d, "dtype": dtype})
    except KeyError as exc:
        raise UserError(f"{p}: missing key {exc}") from None
    except (TypeError, ValueError) as exc:
        raise UserError(f"{p}: {exc}") from None


def resolve_config(spec: str, *, dtype: str = "bfloat16") -> GPTJConfig:
    """A preset name (``gptj-6b``) or a JSON config file."""
    if spec in PRESETS:
        return cast(GPTJConfig, PRESETS[spec].replace(dtype=dtype))
    if Path(spec).is_file():
        return config_from_file(spec, dtype=dtype)
    raise UserError(f"--config: {spec!r} is neither a preset ({sorted(PRESETS)}) nor a JSON file")


def shard_slices(leaf: MtjLeaf, value: np.ndarray, shards: int) -> list[np.ndarray]:
    """What each of ``shards`` shards stores of native leaf ``value``."""
    how = leaf.how
    if how[0] == "cat":
        return np.split(value, shards, axis=how[1])
    if how[0] == "first":
        return [value] * shards
    zero = np.zeros_like(value)  # "sum": all of it on shard 0
    return [value] + [zero] * (shards - 1)
